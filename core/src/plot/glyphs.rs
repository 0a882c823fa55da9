//! A bitmap backend that draws text from font8x8's 8×8 glyphs.
//!
//! plotters draws text through a TrueType font (`ttf`: font-kit, which pulls fontconfig and
//! freetype from the system, or `ab_glyph` with a font file to embed); without either it panics
//! on the first label. This wrapper answers the two text calls itself and passes everything
//! else to `BitMapBackend`, so the plots have labels with no system library and no font file.
//! ASCII only: other characters are drawn as `?`.

use plotters::backend::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};
use plotters_bitmap::BitMapBackendError;

/// Side of a glyph cell at scale 1, in pixels.
const CELL: i32 = 8;

pub struct GlyphBackend<'a> {
    inner: BitMapBackend<'a>,
}

type DrawResult = Result<(), DrawingErrorKind<BitMapBackendError>>;

impl<'a> GlyphBackend<'a> {
    /// Draws into `buf`, `w × h` RGB pixels (3 bytes each).
    pub fn with_buffer(buf: &'a mut [u8], size: (u32, u32)) -> Self {
        Self {
            inner: BitMapBackend::with_buffer(buf, size),
        }
    }
}

/// Integer scale of the 8-pixel glyphs for a font size in pixels: 12–17 px draws them as is.
fn scale(size: f64) -> i32 {
    ((size / 12.0).floor() as i32).max(1)
}

fn glyph(c: char) -> [u8; 8] {
    let i = if c.is_ascii() {
        c as usize
    } else {
        '?' as usize
    };
    font8x8::legacy::BASIC_LEGACY[i]
}

impl DrawingBackend for GlyphBackend<'_> {
    type ErrorType = BitMapBackendError;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> DrawResult {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> DrawResult {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> DrawResult {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> DrawResult {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> DrawResult {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> DrawResult {
        self.inner.draw_path(path, style)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> DrawResult {
        self.inner.fill_polygon(vert, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> DrawResult {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> DrawResult {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let s = scale(style.size());
        let n = text.chars().count() as i32;
        Ok(((n * CELL * s) as u32, (CELL * s) as u32))
    }

    /// The same placement as plotters' default (anchor, then rotation about `pos`), with the
    /// pixels taken from the glyphs.
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> DrawResult {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let s = scale(style.size());
        let (width, height) = (text.chars().count() as i32 * CELL * s, CELL * s);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        for (k, c) in text.chars().enumerate() {
            let rows = glyph(c);
            for (row, bits) in rows.iter().enumerate() {
                for col in 0..CELL {
                    // font8x8: bit 0 of a row byte is its leftmost pixel.
                    if bits >> col & 1 == 0 {
                        continue;
                    }
                    for (sy, sx) in (0..s).flat_map(|sy| (0..s).map(move |sx| (sy, sx))) {
                        let x = k as i32 * CELL * s + col * s + sx + dx;
                        let y = row as i32 * s + sy + dy;
                        let (x, y) = trans.transform(x, y);
                        let (x, y) = (pos.0 + x, pos.1 + y);
                        if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                            self.inner.draw_pixel((x, y), color)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
