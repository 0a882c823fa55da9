//! The plots' one look for a series of measurements: a line with a dot at each point, in the
//! plots' blue, over a light grid.

use plotters::coord::ranged1d::Ranged;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::glyphs::GlyphBackend;

/// The colour of a plot's (first) series.
pub const SERIES_BLUE: RGBColor = RGBColor(86, 119, 164);
/// The colour of the grid's minor lines.
pub const LIGHT_GRID: RGBColor = RGBColor(235, 235, 235);

/// Draws `points` on `chart` as a line of `color` with a dot at each point.
pub fn line_with_dots<X>(
    chart: &mut ChartContext<'_, GlyphBackend<'_>, Cartesian2d<X, RangedCoordf64>>,
    points: &[(X::ValueType, f64)],
    color: RGBColor,
) -> Result<(), Box<dyn std::error::Error>>
where
    X: Ranged,
    X::ValueType: Clone + 'static,
{
    chart.draw_series(LineSeries::new(
        points.iter().cloned(),
        color.stroke_width(2),
    ))?;
    chart.draw_series(
        points
            .iter()
            .map(|p| Circle::new(p.clone(), 4, color.filled())),
    )?;
    Ok(())
}
