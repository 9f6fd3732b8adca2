//! The control path: `/dev/ublk-control` and the io_uring (128-byte SQEs) that carries its
//! commands — adding, configuring, starting, stopping, deleting and recovering a device.

use crate::sys::{self, CtrlCmd, DevInfo, Params};
use crate::UblkError;
use io_uring::{opcode, squeue, types, IoUring};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

/// The control device's path.
pub const CONTROL_PATH: &str = "/dev/ublk-control";

/// An open `/dev/ublk-control` with a ring of its own. Each command waits for its answer.
pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128>,
}

impl Control {
    /// Opens the control device. `UblkError::NoDriver` when the ublk driver is not loaded.
    pub fn open() -> Result<Control, UblkError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(CONTROL_PATH)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => UblkError::NoDriver,
                _ => UblkError::Os {
                    what: "opening /dev/ublk-control",
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                },
            })?;
        let ring = IoUring::<squeue::Entry128>::builder()
            .build(4)
            .map_err(|e| UblkError::os("creating the control ring", &e))?;
        Ok(Control { file, ring })
    }

    /// Sends command `op` (encoded) and waits for its result; `buf` is the command's in/out buffer.
    fn command(
        &mut self,
        what: &'static str,
        op: u32,
        dev_id: u32,
        buf: Option<&mut [u8]>,
        data: u64,
    ) -> Result<i32, UblkError> {
        let (addr, len) = match buf {
            Some(b) => (b.as_mut_ptr() as u64, b.len() as u16),
            None => (0, 0),
        };
        let cmd = CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            len,
            addr,
            data,
        };
        let mut area = [0u8; 80];
        area[..sys::CTRL_CMD_LEN].copy_from_slice(&cmd.encode());
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(area)
            .build();
        push_and_wait(&mut self.ring, sqe, what)
    }

    /// `ADD_DEV`: creates a device (id `info.dev_id`, or any free one when `u32::MAX`) and
    /// returns the driver's view of it, with the id it got.
    pub fn add_dev(&mut self, info: &DevInfo) -> Result<DevInfo, UblkError> {
        let mut b = info.encode();
        let res = self.command(
            "ADD_DEV",
            sys::ctrl_op(sys::CMD_ADD_DEV),
            info.dev_id,
            Some(&mut b),
            0,
        )?;
        check("ADD_DEV", res)?;
        Ok(DevInfo::decode(&b))
    }

    /// `GET_DEV_INFO`: the device's state, or `None` when there is no device `dev_id`.
    pub fn dev_info(&mut self, dev_id: u32) -> Result<Option<DevInfo>, UblkError> {
        let mut b = [0u8; sys::DEV_INFO_LEN];
        let res = self.command(
            "GET_DEV_INFO",
            sys::ctrl_op(sys::CMD_GET_DEV_INFO),
            dev_id,
            Some(&mut b),
            0,
        )?;
        if res == -libc::ENODEV {
            return Ok(None);
        }
        check("GET_DEV_INFO", res)?;
        Ok(Some(DevInfo::decode(&b)))
    }

    /// `SET_PARAMS`: block sizes, capacity, largest request, discard and write-zeroes limits.
    pub fn set_params(&mut self, dev_id: u32, params: &Params) -> Result<(), UblkError> {
        let mut b = params.encode();
        let res = self.command(
            "SET_PARAMS",
            sys::ctrl_op(sys::CMD_SET_PARAMS),
            dev_id,
            Some(&mut b),
            0,
        )?;
        check("SET_PARAMS", res)
    }

    /// `START_DEV`: returns once every queue has fetched every tag and `/dev/ublkbN` exists.
    pub fn start_dev(&mut self, dev_id: u32, pid: i32) -> Result<(), UblkError> {
        let res = self.command(
            "START_DEV",
            sys::ctrl_op(sys::CMD_START_DEV),
            dev_id,
            None,
            pid as u64,
        )?;
        check("START_DEV", res)
    }

    /// `STOP_DEV`: removes `/dev/ublkbN` (the kernel writes back and drains it through the
    /// queues first, so they must keep serving until their tags are aborted).
    pub fn stop_dev(&mut self, dev_id: u32) -> Result<(), UblkError> {
        let res = self.command("STOP_DEV", sys::ctrl_op(sys::CMD_STOP_DEV), dev_id, None, 0)?;
        check("STOP_DEV", res)
    }

    /// `DEL_DEV`: frees the device id; only after the queues closed `/dev/ublkcN`.
    pub fn del_dev(&mut self, dev_id: u32) -> Result<(), UblkError> {
        let res = self.command("DEL_DEV", sys::ctrl_op(sys::CMD_DEL_DEV), dev_id, None, 0)?;
        check("DEL_DEV", res)
    }

    /// `START_USER_RECOVERY`: the dead server's device is quiesced; let a new one map it.
    /// `EBUSY` while the driver has not yet noticed the old server is gone.
    pub fn start_user_recovery(&mut self, dev_id: u32) -> Result<(), UblkError> {
        let res = self.command(
            "START_USER_RECOVERY",
            sys::ctrl_op(sys::CMD_START_USER_RECOVERY),
            dev_id,
            None,
            0,
        )?;
        check("START_USER_RECOVERY", res)
    }

    /// `GET_FEATURES`: the `UBLK_F_*` flags this driver supports; 0 from drivers older than
    /// the command (Linux 6.5), which have none of the optional ones kura asks about.
    pub fn features(&mut self) -> Result<u64, UblkError> {
        let mut b = [0u8; 8];
        let res = self.command("GET_FEATURES", sys::GET_FEATURES_OP, 0, Some(&mut b), 0)?;
        if res < 0 {
            return Ok(0);
        }
        Ok(u64::from_le_bytes(b))
    }

    /// `UPDATE_SIZE`: the live device's capacity becomes `sectors` (the kernel tells the block
    /// layer and user space, as for a disk that changed size). Only where [`Control::features`]
    /// has `UBLK_F_UPDATE_SIZE`.
    pub fn update_size(&mut self, dev_id: u32, sectors: u64) -> Result<(), UblkError> {
        let res = self.command(
            "UPDATE_SIZE",
            sys::ctrl_op(sys::CMD_UPDATE_SIZE),
            dev_id,
            None,
            sectors,
        )?;
        check("UPDATE_SIZE", res)
    }

    /// `END_USER_RECOVERY`: returns once the new queues fetched every tag; the requests held
    /// while no server ran are then reissued to them.
    pub fn end_user_recovery(&mut self, dev_id: u32, pid: i32) -> Result<(), UblkError> {
        let res = self.command(
            "END_USER_RECOVERY",
            sys::ctrl_op(sys::CMD_END_USER_RECOVERY),
            dev_id,
            None,
            pid as u64,
        )?;
        check("END_USER_RECOVERY", res)
    }
}

fn check(what: &'static str, res: i32) -> Result<(), UblkError> {
    if res < 0 {
        Err(UblkError::Command { what, errno: -res })
    } else {
        Ok(())
    }
}

#[allow(unsafe_code)] // io_uring submission of a command whose buffers outlive the wait
fn push_and_wait(
    ring: &mut IoUring<squeue::Entry128>,
    sqe: squeue::Entry128,
    what: &'static str,
) -> Result<i32, UblkError> {
    // SAFETY: the SQE points at `area`-encoded command data copied into the SQE itself and at
    // the caller's buffer, both alive until this function returns, which is after the
    // completion has been reaped below; the ring carries nothing else.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| UblkError::Os {
        what,
        errno: libc::EBUSY,
    })?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(UblkError::os(what, &e)),
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe.result());
        }
    }
}
