//! Per-record stages (`docs/ingest-protocol.md` §4) run between socket and storage:
//! `crc32c` is the record check every stream gets; `zstd` compresses; `classify` is SNAcc's
//! case study on a CPU — decode a binary PPM (P6) or PGM (P5), scale it to 224x224 (nearest
//! neighbour), take its 4x4x4 colour histogram and pick the nearest class centroid. The
//! centroids are trained at start-up from a seeded synthetic set generated here, so the labels
//! are deterministic and need no model file.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Side of the square the classifier looks at (SNAcc's MobileNet input).
pub const SIDE: usize = 224;
/// Histogram bins: 4 levels per channel.
pub const BINS: usize = 64;
/// Largest image side accepted.
pub const MAX_SIDE: usize = 16384;
/// Class names, by label.
pub const CLASSES: [&str; 5] = ["sky", "forest", "sunset", "snow", "night"];
/// Seed of the synthetic training set.
pub const TRAINING_SEED: u64 = 0x005e_ed17;
/// zstd level of the `zstd` stage (fast: the stage runs at network speed).
pub const ZSTD_LEVEL: i32 = 1;

/// Why bytes are not an image this stage reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    #[error("not a binary PPM (P6) or PGM (P5) image")]
    Magic,
    #[error("bad PNM header: {0}")]
    Header(&'static str),
    #[error("image of {width}x{height} is outside 1..={MAX_SIDE} per side")]
    Size { width: usize, height: usize },
    #[error("maxval {0}: only 1..=255 (one byte per sample) is read")]
    MaxVal(usize),
    #[error("pixel data of {got} bytes, the header needs {need}")]
    Short { need: usize, got: usize },
}

/// A decoded image, 8-bit samples, 1 (gray) or 3 (RGB) channels, rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub width: usize,
    pub height: usize,
    pub channels: usize,
    pub pixels: Vec<u8>,
}

/// Parses a binary PPM or PGM: magic, width, height, maxval separated by whitespace and
/// `#` comments, one whitespace byte, then the samples (scaled to 0..=255 when maxval < 255).
pub fn decode_pnm(bytes: &[u8]) -> Result<Image, ImageError> {
    let channels = match bytes.get(..2) {
        Some(b"P6") => 3,
        Some(b"P5") => 1,
        _ => return Err(ImageError::Magic),
    };
    let mut at = 2;
    let mut fields = [0usize; 3];
    for f in &mut fields {
        // Whitespace and comments before each number.
        loop {
            match bytes.get(at) {
                Some(b) if b.is_ascii_whitespace() => at += 1,
                Some(b'#') => {
                    while bytes.get(at).is_some_and(|&b| b != b'\n') {
                        at += 1;
                    }
                }
                Some(b) if b.is_ascii_digit() => break,
                Some(_) => return Err(ImageError::Header("expected a number")),
                None => return Err(ImageError::Header("ends inside the header")),
            }
        }
        let mut n = 0usize;
        while let Some(b) = bytes.get(at).filter(|b| b.is_ascii_digit()) {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(usize::from(b - b'0')))
                .filter(|&n| n <= 1 << 20)
                .ok_or(ImageError::Header("number too large"))?;
            at += 1;
        }
        *f = n;
    }
    let [width, height, maxval] = fields;
    match bytes.get(at) {
        Some(b) if b.is_ascii_whitespace() => at += 1,
        _ => return Err(ImageError::Header("no whitespace after maxval")),
    }
    if width == 0 || height == 0 || width > MAX_SIDE || height > MAX_SIDE {
        return Err(ImageError::Size { width, height });
    }
    if maxval == 0 || maxval > 255 {
        return Err(ImageError::MaxVal(maxval));
    }
    let need = width * height * channels;
    let data = &bytes[at..];
    if data.len() < need {
        return Err(ImageError::Short {
            need,
            got: data.len(),
        });
    }
    let pixels = if maxval == 255 {
        data[..need].to_vec()
    } else {
        data[..need]
            .iter()
            .map(|&v| (usize::from(v).min(maxval) * 255 / maxval) as u8)
            .collect()
    };
    Ok(Image {
        width,
        height,
        channels,
        pixels,
    })
}

/// A binary PPM of `width`x`height` RGB pixels.
pub fn encode_ppm(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    let mut out = format!("P6\n{width} {height}\n255\n").into_bytes();
    out.extend_from_slice(rgb);
    out
}

/// Nearest-neighbour scaling to `w`x`h`.
pub fn downscale(img: &Image, w: usize, h: usize) -> Image {
    let c = img.channels;
    let mut pixels = Vec::with_capacity(w * h * c);
    for y in 0..h {
        let sy = y * img.height / h;
        for x in 0..w {
            let sx = x * img.width / w;
            let at = (sy * img.width + sx) * c;
            pixels.extend_from_slice(&img.pixels[at..at + c]);
        }
    }
    Image {
        width: w,
        height: h,
        channels: c,
        pixels,
    }
}

/// The normalised 4x4x4 colour histogram (gray images count as r = g = b).
pub fn histogram(img: &Image) -> [f64; BINS] {
    let mut counts = [0u64; BINS];
    for px in img.pixels.chunks_exact(img.channels) {
        let (r, g, b) = if img.channels == 3 {
            (px[0], px[1], px[2])
        } else {
            (px[0], px[0], px[0])
        };
        counts[usize::from(r >> 6) * 16 + usize::from(g >> 6) * 4 + usize::from(b >> 6)] += 1;
    }
    let total = counts.iter().sum::<u64>().max(1) as f64;
    let mut h = [0f64; BINS];
    for (o, c) in h.iter_mut().zip(counts) {
        *o = c as f64 / total;
    }
    h
}

/// The base colours of a class's synthetic images, top half and bottom half.
fn palette(class: usize) -> ([u8; 3], [u8; 3]) {
    match class {
        0 => ([90, 150, 235], [120, 170, 220]), // sky: blue over pale blue
        1 => ([40, 110, 40], [90, 70, 40]),     // forest: green over brown
        2 => ([240, 120, 40], [150, 40, 60]),   // sunset: orange over crimson
        3 => ([235, 235, 240], [200, 205, 215]), // snow: white over gray
        _ => ([15, 15, 40], [30, 30, 30]),      // night: dark
    }
}

/// A synthetic RGB image of `class`: two bands of its palette with per-pixel noise and a few
/// blobs of another class's colour, as raw RGB.
pub fn synthetic_rgb(class: usize, width: usize, height: usize, rng: &mut SmallRng) -> Vec<u8> {
    let (top, bottom) = palette(class % CLASSES.len());
    let split = height * rng.gen_range(35..65) / 100;
    let (other, _) = palette(rng.gen_range(0..CLASSES.len()));
    let blobs: Vec<(usize, usize, usize)> = (0..3)
        .map(|_| {
            (
                rng.gen_range(0..width),
                rng.gen_range(0..height),
                rng.gen_range(1..=(width.min(height) / 8).max(1)),
            )
        })
        .collect();
    let mut out = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        for x in 0..width {
            let in_blob = blobs
                .iter()
                .any(|&(bx, by, r)| bx.abs_diff(x).pow(2) + by.abs_diff(y).pow(2) <= r * r);
            let base = if in_blob {
                other
            } else if y < split {
                top
            } else {
                bottom
            };
            for ch in base {
                let noise: i16 = rng.gen_range(-35..=35);
                out.push((i16::from(ch) + noise).clamp(0, 255) as u8);
            }
        }
    }
    out
}

/// Nearest-centroid classifier over colour histograms.
#[derive(Debug, Clone)]
pub struct Classifier {
    centroids: Vec<[f64; BINS]>,
}

impl Classifier {
    /// Trains on `per_class` synthetic 64x64 images of each class from `seed`.
    pub fn trained(seed: u64, per_class: usize) -> Classifier {
        let mut rng = SmallRng::seed_from_u64(seed);
        let centroids = (0..CLASSES.len())
            .map(|class| {
                let mut sum = [0f64; BINS];
                for _ in 0..per_class {
                    let rgb = synthetic_rgb(class, 64, 64, &mut rng);
                    let img = Image {
                        width: 64,
                        height: 64,
                        channels: 3,
                        pixels: rgb,
                    };
                    for (s, v) in sum.iter_mut().zip(histogram(&img)) {
                        *s += v;
                    }
                }
                sum.map(|s| s / per_class.max(1) as f64)
            })
            .collect();
        Classifier { centroids }
    }

    /// The classifier every server uses (same seed, same labels everywhere).
    pub fn standard() -> &'static Classifier {
        static C: std::sync::OnceLock<Classifier> = std::sync::OnceLock::new();
        C.get_or_init(|| Classifier::trained(TRAINING_SEED, 24))
    }

    /// The label of an image: scaled to 224x224, histogram, nearest centroid (L2).
    pub fn classify(&self, img: &Image) -> u8 {
        let h = histogram(&downscale(img, SIDE, SIDE));
        let mut best = (f64::MAX, 0u8);
        for (label, c) in self.centroids.iter().enumerate() {
            let d: f64 = c.iter().zip(&h).map(|(a, b)| (a - b) * (a - b)).sum();
            if d < best.0 {
                best = (d, label as u8);
            }
        }
        best.1
    }

    /// Decodes and labels a PPM/PGM record; `None` when it is not one.
    pub fn label(&self, bytes: &[u8]) -> Option<u8> {
        decode_pnm(bytes).ok().map(|img| self.classify(&img))
    }
}

/// The `zstd` stage's compression.
pub fn compress(data: &[u8]) -> std::io::Result<Vec<u8>> {
    zstd::bulk::compress(data, ZSTD_LEVEL)
}

/// Undoes [`compress`] for a record of `orig_len` bytes.
pub fn decompress(stored: &[u8], orig_len: usize) -> std::io::Result<Vec<u8>> {
    let out = zstd::bulk::decompress(stored, orig_len)?;
    if out.len() != orig_len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "decompressed {} bytes, the index says {orig_len}",
                out.len()
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_synthetic_images_are_labelled_correctly() {
        let c = Classifier::trained(TRAINING_SEED, 24);
        let mut rng = SmallRng::seed_from_u64(999);
        let mut right = 0;
        let total = 100;
        for i in 0..total {
            let class = i % CLASSES.len();
            let (w, h) = (rng.gen_range(100..400), rng.gen_range(100..400));
            let ppm = encode_ppm(w, h, &synthetic_rgb(class, w, h, &mut rng));
            if c.label(&ppm) == Some(class as u8) {
                right += 1;
            }
        }
        assert!(right >= 90, "{right} of {total} held-out images right");
    }

    #[test]
    fn labels_are_deterministic_and_gray_images_work() {
        let a = Classifier::trained(TRAINING_SEED, 24);
        let b = Classifier::trained(TRAINING_SEED, 24);
        let mut rng = SmallRng::seed_from_u64(5);
        let ppm = encode_ppm(300, 200, &synthetic_rgb(2, 300, 200, &mut rng));
        assert_eq!(a.label(&ppm), b.label(&ppm));
        // A bright gray PGM with a comment and maxval 100 is snow.
        let mut pgm = b"P5 # a comment\n 40 30\n100\n".to_vec();
        pgm.extend(std::iter::repeat_n(95u8, 40 * 30));
        assert_eq!(a.label(&pgm), Some(3));
    }

    #[test]
    fn malformed_images_give_typed_errors() {
        assert_eq!(decode_pnm(b"P3 1 1 255\n0 0 0"), Err(ImageError::Magic));
        assert!(matches!(
            decode_pnm(b"P6 2 2 255\n\x00\x00"),
            Err(ImageError::Short { need: 12, got: 2 })
        ));
        assert!(matches!(
            decode_pnm(b"P6 0 2 255\n"),
            Err(ImageError::Size { .. })
        ));
        assert!(matches!(
            decode_pnm(b"P5 99999 99999 255\n"),
            Err(ImageError::Size { .. })
        ));
        assert!(matches!(
            decode_pnm(b"P5 2 2 65535\n"),
            Err(ImageError::MaxVal(65535))
        ));
        assert!(matches!(decode_pnm(b"P5 2"), Err(ImageError::Header(_))));
        assert!(matches!(
            decode_pnm(b"P5 99999999999999999999 2 255\n"),
            Err(ImageError::Header(_))
        ));
    }

    #[test]
    fn zstd_round_trips() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let z = compress(&data).expect("compress");
        assert!(z.len() < data.len() / 10);
        assert_eq!(decompress(&z, data.len()).expect("decompress"), data);
        assert!(decompress(&z, data.len() - 1).is_err());
    }
}
