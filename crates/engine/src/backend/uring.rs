//! PLACEHOLDER — being written now; replaced before this work is committed as done.

use crate::device::{BlockDevice, Completion, Geometry, Rejected, Request};
use crate::error::{DeviceResult, OpenError};
use crate::spec::Spec;

pub struct UringDevice;

impl BlockDevice for UringDevice {
    fn geometry(&self) -> Geometry {
        unreachable!()
    }
    fn describe(&self) -> String {
        unreachable!()
    }
    fn submit(&mut self, _req: Request) -> Result<(), Rejected> {
        unreachable!()
    }
    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        unreachable!()
    }
    fn poll(&mut self, _out: &mut Vec<Completion>, _min: usize) -> DeviceResult<usize> {
        unreachable!()
    }
    fn in_flight(&self) -> usize {
        unreachable!()
    }
}

pub fn open(_spec: &Spec) -> Result<UringDevice, OpenError> {
    Err(OpenError::Unavailable {
        backend: "uring",
        feature: "uring".into(),
        why: "not built yet".into(),
    })
}
