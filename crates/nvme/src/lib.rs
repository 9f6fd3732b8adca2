//! User-space NVMe over VFIO and io_uring NVMe passthrough (issue 7).
