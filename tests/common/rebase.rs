//! Recording backends that start from a crash image (the cluster simulator's recording backend,
//! `tests/sim/crash.rs`, reopens a crashed node on one and keeps recording, so it can crash again),
//! and log checkpoints that keep a long recording small.

use super::{FaultBackend, Rec};

impl FaultBackend {
    /// A recording file that starts as `image`. Its log starts with records that rebuild the
    /// image and make it durable (`SetLen`, one `Write` at offset 0, `Sync`), so
    /// [`super::crash_image`] works on it as on a file recorded from empty.
    pub fn recording_from_image(image: Vec<u8>) -> Self {
        let b = Self::recording();
        {
            let mut s = b.lock();
            s.log = vec![
                Rec::SetLen(image.len() as u64),
                Rec::Write {
                    offset: 0,
                    data: image.clone(),
                },
                Rec::Sync,
            ];
            s.live = image;
        }
        b
    }

    /// When everything recorded is durable (the log ends with a successful sync), replaces the
    /// log by the three records that rebuild the current file (as
    /// [`FaultBackend::recording_from_image`]); crash images cut from later points are the
    /// same as before. Returns false, changing nothing, otherwise.
    pub fn checkpoint(&self) -> bool {
        let mut s = self.lock();
        if !s.recording || s.log.last() != Some(&Rec::Sync) {
            return false;
        }
        let live = s.live.clone();
        s.log = vec![
            Rec::SetLen(live.len() as u64),
            Rec::Write {
                offset: 0,
                data: live,
            },
            Rec::Sync,
        ];
        true
    }
}
