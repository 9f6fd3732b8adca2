//! The engine's backends: each turns the device interface into real I/O on one kind of target.
//!
//! | kind       | module     | what it does |
//! |------------|------------|--------------|
//! | `mem`      | [`mem`]    | RAM disk, the embedded default for tests |
//! | `null`     | [`mem`]    | completes instantly; measures the interface's own cost |
//! | `uring`    | [`uring`]  | io_uring on a file or block device: O_DIRECT, registered files and buffers, SQPOLL |
//! | `sync`     | [`sync`]   | pread/pwrite/fdatasync, the kernel-mediated baseline |
//! | `redirect` | [`redirect`] | every command served by a separate proxy process over shared memory |
//! | `file`     | (open.rs)  | an image file on the best of the above that the kernel allows |

pub mod common;
pub mod file;
pub mod mem;
pub mod redirect;
pub mod sync;
pub mod uring;
