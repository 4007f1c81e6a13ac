//! The data directory's file system as `GET /metrics` reports it: read with
//! statvfs on a blocking thread (`admin/mod.rs`), registered as gauges.

use prometheus_client::registry::{Registry, Unit};

use super::{gauge_value, DirLabels, Gauges};

/// The data directory's file system, as statvfs reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpace {
    pub dir: String,
    /// Bytes an unprivileged process may still allocate (`f_bavail`).
    pub available_bytes: u64,
    /// Free bytes the file system keeps back for the superuser
    /// (`f_bfree - f_bavail`).
    pub reserved_bytes: u64,
    /// The file system's size (`f_blocks`).
    pub size_bytes: u64,
}

/// statvfs of `dir`. Blocking: call it off any executor.
///
/// # Errors
/// The path is not valid for the call, or statvfs failed.
// The statvfs fields are u64 on this platform, narrower on others.
#[allow(clippy::useless_conversion)]
pub fn disk_space(dir: &std::path::Path) -> std::io::Result<DiskSpace> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string that outlives the call and
    // `stat` is writable memory of the struct's size, which statvfs fills.
    let status = unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) };
    if status != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it initialised `stat`.
    let stat = unsafe { stat.assume_init() };
    let block = u64::from(stat.f_frsize);
    let available = u64::from(stat.f_bavail);
    let free = u64::from(stat.f_bfree);
    Ok(DiskSpace {
        dir: dir.display().to_string(),
        available_bytes: available.saturating_mul(block),
        reserved_bytes: free.saturating_sub(available).saturating_mul(block),
        size_bytes: u64::from(stat.f_blocks).saturating_mul(block),
    })
}

/// `spool_disk_available_bytes`, `spool_disk_reserved_bytes`,
/// `spool_disk_size_bytes` of the data directory.
pub(super) fn register_disk(registry: &mut Registry, disk: &DiskSpace) {
    let labels = DirLabels { dir: disk.dir.clone() };
    for (name, help, value) in [
        (
            "spool_disk_available",
            "Bytes the broker may still write in the data directory's file system (statvfs f_bavail)",
            disk.available_bytes,
        ),
        (
            "spool_disk_reserved",
            "Free bytes of the data directory's file system kept back for the superuser (f_bfree - f_bavail)",
            disk.reserved_bytes,
        ),
        ("spool_disk_size", "Size of the data directory's file system", disk.size_bytes),
    ] {
        let family = Gauges::<DirLabels>::default();
        family.get_or_create(&labels).set(gauge_value(value));
        registry.register_with_unit(name, help, Unit::Bytes, family);
    }
}

#[cfg(test)]
mod tests {
    use super::disk_space;

    // Goal: statvfs of a real directory gives a file system with room in
    // it; a missing directory is an error, not a panic. Method: the temp dir.
    #[test]
    fn disk_space_of_a_directory() {
        let disk = disk_space(&std::env::temp_dir()).unwrap();
        assert!(disk.size_bytes > 0 && disk.available_bytes <= disk.size_bytes, "{disk:?}");
        assert!(disk_space(std::path::Path::new("/no/such/spool/dir")).is_err());
    }
}
