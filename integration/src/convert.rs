//! The converter and registry client as the tests use them: a [`client`] with plain HTTP for
//! the test registries, and [`convert`] (registry to registry, default options).

use anyhow::Result;
use std::sync::Arc;
use weenv_converter::{
    convert_image, registry_config, ConvertOptions, ImageLocation, ImageReport, NoProgress,
};
use weenv_registry::Client;

/// A registry client with plain HTTP for `hosts`.
pub fn client(hosts: &[String]) -> Result<Client> {
    Ok(Client::new(registry_config(hosts))?)
}

/// Convert `src` to weenv at `dst` with default options.
pub async fn convert(client: &Client, src: &str, dst: &str) -> Result<ImageReport> {
    convert_with(client, src, dst, &ConvertOptions::default()).await
}

/// Convert `src` to `dst` with `opts`.
pub async fn convert_with(
    client: &Client,
    src: &str,
    dst: &str,
    opts: &ConvertOptions,
) -> Result<ImageReport> {
    Ok(convert_image(
        client,
        &ImageLocation::parse(src)?,
        &ImageLocation::parse(dst)?,
        opts,
        Arc::new(NoProgress),
    )
    .await?)
}

/// Sum of the layer sizes of `reference` (the image's bytes in the registry).
pub async fn image_layer_bytes(client: &Client, reference: &str) -> Result<u64> {
    let r: weenv_registry::Reference = reference.parse()?;
    let (m, _) = client
        .get_image_manifest(
            &r,
            "linux",
            &weenv_registry::manifest::host_platform().architecture,
            None,
        )
        .await?;
    Ok(m.layers.iter().map(|l| l.size).sum())
}
