//! weenv layer format.
//!
//! A weenv layer is a valid `application/vnd.oci.image.layer.v1.tar+zstd` blob whose
//! decompression is the original tar byte for byte, cut into independent zstd frames, with a
//! table of contents (TOC) in a zstd skippable frame at the tail, followed by a fixed-size
//! footer (also a skippable frame) that locates and authenticates the TOC.
//!
//! Parts:
//! - [`toc`]: TOC types (entries, frames, chunk references) and their encoding.
//! - [`footer`]: the fixed-size footer.
//! - [`writer`]: tar stream -> weenv layer blob (streaming, memory bounded).
//! - [`reader`]: [`RangeRead`] + footer/TOC location and verification, file reads.
//! - [`frame`]: decompress and verify one frame.
//! - [`fetch`]: pure planning of which blob ranges to fetch (coalescing).
//! - [`prefetch`]: start-up prefetch profiles (manifest annotation, merged-view path resolution).
//! - [`tar`]: our streaming tar parser; [`tarcheck`]: proof that a TOC equals its tar stream; [`paths`]: path normalisation and namespace rules;
//!   `validate`: semantic TOC validation ([`Toc::validate`]).
//!
//! The byte layout, TOC schema and versioning are documented in `format/README.md`.

pub mod digest;
pub mod error;
pub mod fetch;
pub mod footer;
pub mod frame;
pub mod paths;
pub mod prefetch;
pub mod range;
pub mod reader;
pub mod snapshot_labels;
pub mod tar;
pub mod tarcheck;
pub mod testdata;
pub mod toc;
mod validate;
pub mod writer;
mod writer_pool;

pub use digest::Digest;
pub use error::FormatError;
pub use fetch::{frames_for_dir, frames_for_range, plan_fetch, FetchRange};
pub use footer::{Footer, FOOTER_SIZE};
pub use frame::decode_frame;
pub use range::RangeRead;
pub use reader::{LayerReader, TocHint, VerifyReport};
pub use tarcheck::{check_entry_header, StreamChecker, StreamReport};
pub use toc::{ChunkRef, Entry, EntryKind, Frame, FrameIdx, Toc, TocLimits};
pub use writer::{
    descriptor_annotations, write_layer, write_layer_parallel, LayerSummary, WriterOptions,
};

/// Layer media type of a weenv layer (it is an ordinary zstd layer).
pub const MEDIA_TYPE_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Descriptor annotation: digest of the (compressed) TOC bytes.
pub const ANNOTATION_TOC_DIGEST: &str = "io.weenv.toc.digest";
/// Descriptor annotation: byte offset of the TOC skippable frame in the blob.
pub const ANNOTATION_TOC_OFFSET: &str = "io.weenv.toc.offset";
/// Descriptor annotation: length of TOC skippable frame + footer (one ranged GET reads both).
pub const ANNOTATION_TOC_LENGTH: &str = "io.weenv.toc.length";
/// Descriptor annotation: format version.
pub const ANNOTATION_FORMAT_VERSION: &str = "io.weenv.format.version";
/// Current format version.
pub const FORMAT_VERSION: u32 = 2;
