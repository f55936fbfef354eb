//! Plot helpers shared by the benchmark examples (`peers_bench`, `rollout_report`): the font
//! plotters draws text with, and the series colours.

use anyhow::{Context, Result};
use plotters::prelude::*;

/// Registers the TrueType font plotters' "sans-serif" resolves to (`$WEENV_FONT`, default
/// DejaVu Sans): the bitmap backend has no built-in font.
pub fn register_font() -> Result<()> {
    let font = std::env::var("WEENV_FONT")
        .unwrap_or_else(|_| "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".into());
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(&font)
            .with_context(|| format!("reading font {font} (set WEENV_FONT)"))?
            .into_boxed_slice(),
    );
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("bad font {font}"))?;
    Ok(())
}

/// Distinct series colours, in order (red and blue first, as the peers plot uses them).
#[allow(dead_code)] // peers_bench uses the first two by name
pub const PALETTE: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draws the legend of `ch` at `pos`: black border on white.
pub fn legend<'a, DB, CT>(ch: &mut ChartContext<'a, DB, CT>, pos: SeriesLabelPosition) -> Result<()>
where
    DB: DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    ch.configure_series_labels()
        .position(pos)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the legend: {e}"))
}
