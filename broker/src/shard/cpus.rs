//! Which CPUs this process may run shards on.
//!
//! Owns one query: the CPU affinity mask the process was started with
//! (taskset, cgroups, container limits). Shard `i` is pinned to the `i`-th
//! allowed CPU, so `--cores N` never names a CPU the kernel would refuse.

/// Most CPUs the affinity query looks at (size of `cpu_set_t`).
pub const CPU_SET_CAPACITY: usize = libc::CPU_SETSIZE as usize;

/// The CPUs this process may run on, ascending. Falls back to
/// `0..available_parallelism` if the affinity query fails.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: we pass the size of the set we own; pid 0 = this thread, whose
    // mask the main thread inherited from the process at start.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let count = std::thread::available_parallelism().map_or(1, usize::from);
        return (0..count).collect();
    }
    (0..CPU_SET_CAPACITY)
        // SAFETY: cpu < CPU_SETSIZE, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the allowed set is non-empty, ascending and no smaller than
    // what std reports. Method: compare with available_parallelism.
    #[test]
    fn allowed_cpus_match_available_parallelism() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|pair| pair[0] < pair[1]));
        // std also applies cgroup CPU quotas, so it may report fewer.
        assert!(cpus.len() >= std::thread::available_parallelism().unwrap().get());
    }
}
