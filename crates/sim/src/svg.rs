//! A small SVG writer for line charts and heatmaps: no fonts or native libraries needed, text is
//! left to the viewer.

use std::fmt::Write;

pub const PALETTE: &[&str] = &[
    "#000000", "#7f7f7f", "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#393b79",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// "Nice" tick step for a range.
fn step(range: f64, target: f64) -> f64 {
    let raw = (range / target).max(1e-12);
    let p = 10f64.powf(raw.log10().floor());
    let f = raw / p;
    p * if f < 1.5 {
        1.0
    } else if f < 3.5 {
        2.0
    } else if f < 7.5 {
        5.0
    } else {
        10.0
    }
}

fn fmt_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: Vec<Series>,
    pub y_min: Option<f64>,
    pub y_max: Option<f64>,
    pub width: f64,
    pub height: f64,
}

impl LineChart<'_> {
    pub fn render(&self) -> String {
        let (w, h) = (self.width, self.height);
        let (ml, mr, mt, mb) = (64.0, 150.0, 34.0, 46.0);
        let pw = w - ml - mr;
        let ph = h - mt - mb;
        let pts = self.series.iter().flat_map(|s| s.points.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        let y0 = self.y_min.unwrap_or(y0.min(0.0));
        let mut y1 = self.y_max.unwrap_or(y1 * 1.05);
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        let sx = |x: f64| ml + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| mt + ph - (y.clamp(y0, y1) - y0) / (y1 - y0) * ph;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
            ml + pw / 2.0,
            esc(self.title)
        );
        let xs = step(x1 - x0, 8.0);
        let mut x = (x0 / xs).ceil() * xs;
        while x <= x1 + 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{0:.1}" y2="{2:.1}" stroke="#e5e5e5"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}</text>"##,
                sx(x),
                mt,
                mt + ph,
                mt + ph + 16.0,
                fmt_tick(x, xs)
            );
            x += xs;
        }
        let ys = step(y1 - y0, 6.0);
        let mut y = (y0 / ys).ceil() * ys;
        while y <= y1 + 1e-9 {
            let _ = writeln!(
                s,
                r##"<line x1="{0:.1}" y1="{1:.1}" x2="{2:.1}" y2="{1:.1}" stroke="#e5e5e5"/><text x="{3:.1}" y="{4:.1}" text-anchor="end">{5}</text>"##,
                ml,
                sy(y),
                ml + pw,
                ml - 6.0,
                sy(y) + 4.0,
                fmt_tick(y, ys)
            );
            y += ys;
        }
        let _ = writeln!(
            s,
            r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            ml + pw / 2.0,
            h - 8.0,
            esc(self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            mt + ph / 2.0,
            esc(self.y_label)
        );
        for (i, se) in self.series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            let mut d = String::new();
            for (k, &(x, y)) in se.points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if k == 0 { "M" } else { " L" },
                    sx(x),
                    sy(y)
                );
            }
            let dash = if i >= PALETTE.len() {
                r#" stroke-dasharray="4 3""#
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{c}" stroke-width="1.6"{dash}/>"#
            );
            let ly = mt + 10.0 + i as f64 * 18.0;
            let lx = ml + pw + 12.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
                lx + 20.0,
                lx + 26.0,
                ly + 4.0,
                esc(&se.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Heatmap: `cells[row][col]` in 0..=1, rows drawn bottom (row 0) to top, columns left to right.
pub struct Heatmap<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_max: f64,
    /// Columns (time) of rows (address buckets).
    pub cols: &'a [Vec<f32>],
    pub width: f64,
    pub height: f64,
    /// Colour ramp end, e.g. "#d62728".
    pub hot: (u8, u8, u8),
}

impl Heatmap<'_> {
    pub fn render(&self) -> String {
        let (w, h) = (self.width, self.height);
        let (ml, mr, mt, mb) = (64.0, 20.0, 34.0, 46.0);
        let pw = w - ml - mr;
        let ph = h - mt - mb;
        let nc = self.cols.len().max(1);
        let nr = self.cols.first().map_or(1, |c| c.len().max(1));
        let max = self
            .cols
            .iter()
            .flat_map(|c| c.iter())
            .fold(0f32, |a, &b| a.max(b))
            .max(1e-12);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"#,
            ml + pw / 2.0,
            esc(self.title)
        );
        let cw = pw / nc as f64;
        let rh = ph / nr as f64;
        let (hr, hg, hb) = self.hot;
        // Colour levels (sqrt ramp so a 10x colder bucket is still visible), quantised so runs
        // of equal cells along time become one rectangle.
        let level = |v: f32| (((v / max) as f64).sqrt() * 32.0).round() as u32;
        for r in 0..nr {
            let mut c = 0;
            while c < nc {
                let l = self.cols[c].get(r).map_or(0, |&v| level(v));
                let mut e = c + 1;
                while e < nc && self.cols[e].get(r).map_or(0, |&v| level(v)) == l {
                    e += 1;
                }
                if l > 0 {
                    let f = l as f64 / 32.0;
                    let mix = |a: u8| (255.0 - (255.0 - a as f64) * f) as u8;
                    let _ = writeln!(
                        s,
                        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="rgb({},{},{})"/>"#,
                        ml + c as f64 * cw,
                        mt + ph - (r + 1) as f64 * rh,
                        (e - c) as f64 * cw + 0.3,
                        rh + 0.3,
                        mix(hr),
                        mix(hg),
                        mix(hb)
                    );
                }
                c = e;
            }
        }
        let _ = writeln!(
            s,
            r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let xs = step(self.x_max, 8.0);
        let mut x = 0.0;
        while x <= self.x_max + 1e-9 {
            let px = ml + x / self.x_max.max(1e-9) * pw;
            let _ = writeln!(
                s,
                r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                mt + ph + 16.0,
                fmt_tick(x, xs)
            );
            x += xs;
        }
        for (frac, label) in [(0.0, "0"), (0.5, "50%"), (1.0, "100%")] {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
                ml - 6.0,
                mt + ph - frac * ph + 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            ml + pw / 2.0,
            h - 8.0,
            esc(self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            mt + ph / 2.0,
            esc(self.y_label)
        );
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_wellformed_svg() {
        let c = LineChart {
            title: "t <1>",
            x_label: "s",
            y_label: "y",
            series: vec![Series {
                name: "a".into(),
                points: vec![(0.0, 0.5), (10.0, 1.0)],
            }],
            y_min: Some(0.0),
            y_max: Some(1.1),
            width: 600.0,
            height: 300.0,
        }
        .render();
        assert!(c.starts_with("<svg") && c.trim_end().ends_with("</svg>"));
        assert!(c.contains("t &lt;1&gt;") && c.contains("<path d=\"M"));
        let cols = vec![vec![0.0f32, 1.0], vec![0.5, 0.5]];
        let h = Heatmap {
            title: "h",
            x_label: "s",
            y_label: "addr",
            x_max: 2.0,
            cols: &cols,
            width: 300.0,
            height: 200.0,
            hot: (214, 39, 40),
        }
        .render();
        assert_eq!(h.matches("<rect").count(), 1 + 3 + 1);
    }
}
