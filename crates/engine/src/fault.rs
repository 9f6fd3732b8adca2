//! PLACEHOLDER — being written now.
use crate::device::BlockDevice;
use crate::error::OpenError;
use crate::spec::Spec;
pub fn open(
    _spec: &Spec,
    _children: &dyn Fn(&Spec) -> Result<Box<dyn BlockDevice>, OpenError>,
) -> Result<Box<dyn BlockDevice>, OpenError> {
    Err(OpenError::Invalid("not built yet".into()))
}
