//! What the PNG plots of `report` and `tune` share: plotters draws into an RGB buffer through
//! [`GlyphBackend`] (text from font8x8's bitmap glyphs, so no system font library), and `png`
//! encodes it — no image crate, nothing from the system.

mod glyphs;
mod style;

pub use glyphs::GlyphBackend;
pub use style::{line_with_dots, LIGHT_GRID, SERIES_BLUE};

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// A whole plot, or a part of one.
pub type Area<'a> = DrawingArea<GlyphBackend<'a>, Shift>;
pub type PlotResult = Result<(), Box<dyn std::error::Error>>;

/// Draws into a fresh white RGB buffer of `size` pixels.
pub fn render(
    size: (u32, u32),
    draw: impl FnOnce(&Area) -> PlotResult,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut buf = vec![0u8; (size.0 * size.1 * 3) as usize];
    {
        let area = GlyphBackend::with_buffer(&mut buf, size).into_drawing_area();
        area.fill(&WHITE)?;
        draw(&area)?;
        area.present()?;
    }
    Ok(buf)
}

/// Writes an RGB buffer of `size` pixels as a PNG file.
pub fn write_png(
    path: &Path,
    size: (u32, u32),
    rgb: &[u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, size.0, size.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}
