//! Build (or reuse from the cache) one of the offline test images and print where it is:
//! `cargo run -p weenv-integration --example test_image -- busybox|python|python-fast`
//! prints `oci:<layout dir>:<tag>`. Used by scripts/demo.sh and integration/bench/.

use weenv_integration::images;

fn main() -> anyhow::Result<()> {
    let which = std::env::args().nth(1).unwrap_or_else(|| "busybox".into());
    let img = match which.as_str() {
        "busybox" => images::busybox()?,
        "python" => images::python()?,
        "python-fast" => images::python_fast()?,
        other => anyhow::bail!("unknown test image {other:?} (busybox, python, python-fast)"),
    };
    println!("{}", img.oci_ref());
    Ok(())
}
