//! The bytes of one crash-disk image, in copy-on-write pages.
//!
//! A power cut copies a disk's durable image (twice: the new disk's durable
//! and current images), and every simulated power loss cuts every file of
//! every broker: as flat vectors that was 3% of a simulation's
//! instructions, and zero-filling new segments 2% more. Here a copy shares
//! its pages until one side writes to a page, and pages never written are
//! not stored (they read as zeros).

use std::sync::Arc;

/// Bytes per page.
const PAGE_BYTES: usize = 4096;

type Page = Arc<[u8; PAGE_BYTES]>;

/// A disk image: `len` bytes, zeros where no page is stored.
#[derive(Clone, Default)]
pub(super) struct Image {
    len: usize,
    /// Page `i` holds bytes `i * PAGE_BYTES ..`; `None` is all zeros. The
    /// bytes of the last page past `len` are zeros.
    pages: Vec<Option<Page>>,
}

impl Image {
    /// Its length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Grow with zeros or cut to `len` bytes.
    pub(super) fn resize(&mut self, len: usize) {
        if len < self.len {
            self.pages.truncate(len.div_ceil(PAGE_BYTES));
            let within = len % PAGE_BYTES;
            if within != 0 {
                if let Some(Some(page)) = self.pages.last_mut() {
                    Arc::make_mut(page)[within..].fill(0);
                }
            }
        } else {
            self.pages.resize(len.div_ceil(PAGE_BYTES), None);
        }
        self.len = len;
    }

    /// Write `data` at `offset`, growing the image with zeros first if
    /// needed, as writing past the end of a file does.
    pub(super) fn write(&mut self, offset: usize, data: &[u8]) {
        let end = offset + data.len();
        if end > self.len {
            self.resize(end);
        }
        let mut at = offset;
        while at < end {
            let (index, within) = (at / PAGE_BYTES, at % PAGE_BYTES);
            let n = (PAGE_BYTES - within).min(end - at);
            let page = self.pages[index].get_or_insert_with(|| Arc::new([0; PAGE_BYTES]));
            Arc::make_mut(page)[within..within + n].copy_from_slice(&data[at - offset..at - offset + n]);
            at += n;
        }
    }

    /// Read `out.len()` bytes at `offset`; `None` if they reach past the end.
    pub(super) fn read(&self, offset: usize, out: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(out.len()).filter(|end| *end <= self.len)?;
        let mut at = offset;
        while at < end {
            let (index, within) = (at / PAGE_BYTES, at % PAGE_BYTES);
            let n = (PAGE_BYTES - within).min(end - at);
            let target = &mut out[at - offset..at - offset + n];
            match &self.pages[index] {
                Some(page) => target.copy_from_slice(&page[within..within + n]),
                None => target.fill(0),
            }
            at += n;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(image: &Image) -> Vec<u8> {
        let mut out = vec![0xAA; image.len()];
        image.read(0, &mut out).unwrap();
        out
    }

    /// The image behaves as a flat vector through writes across pages,
    /// growth, and cuts in the middle of a page followed by growth.
    #[test]
    fn an_image_reads_as_the_flat_bytes_written() {
        let mut image = Image::default();
        let mut flat: Vec<u8> = Vec::new();
        let write = |image: &mut Image, flat: &mut Vec<u8>, offset: usize, data: &[u8]| {
            image.write(offset, data);
            if flat.len() < offset + data.len() {
                flat.resize(offset + data.len(), 0);
            }
            flat[offset..offset + data.len()].copy_from_slice(data);
        };
        write(&mut image, &mut flat, 10, &[1; 5000]);
        write(&mut image, &mut flat, 20_000, &[2; 3]);
        assert_eq!(bytes(&image), flat);
        image.resize(4100);
        flat.resize(4100, 0);
        assert_eq!(bytes(&image), flat);
        // Bytes past a cut read as zeros once the image grows again.
        image.resize(9000);
        flat.resize(9000, 0);
        assert_eq!(bytes(&image), flat);
        write(&mut image, &mut flat, 8190, &[3; 10]);
        assert_eq!(bytes(&image), flat);
        assert!(image.read(8999, &mut [0; 2]).is_none(), "a read past the end is refused");
        assert!(image.read(usize::MAX, &mut [0; 2]).is_none());
    }

    /// A copy shares its pages, and a write to either side leaves the
    /// other as it was.
    #[test]
    fn a_copy_is_independent_of_its_original() {
        let mut original = Image::default();
        original.write(0, &[1; 10_000]);
        let mut copy = original.clone();
        copy.write(5000, &[2; 10]);
        original.write(0, &[3; 10]);
        assert_eq!(bytes(&copy)[5000..5010], [2; 10]);
        assert_eq!(bytes(&copy)[0..10], [1; 10]);
        assert_eq!(bytes(&original)[5000..5010], [1; 10]);
        assert_eq!(bytes(&original)[0..10], [3; 10]);
    }
}
