//! The server's resident memory and CPU time, from `/proc` (read with the procfs crate):
//! memory per idle subscriber and CPU per delivered event.

use std::time::Duration;

/// The server's resident memory in bytes; says on stderr which process it read (a wrong
/// pid, such as the shell that started the server, shows here).
#[cfg(target_os = "linux")]
pub(super) fn read_rss(pid: u32, when: &str) -> Option<u64> {
    let status = i32::try_from(pid)
        .map_err(|e| e.to_string())
        .and_then(|pid| procfs::process::Process::new(pid).map_err(|e| e.to_string()))
        .and_then(|process| process.status().map_err(|e| e.to_string()));
    match status {
        Ok(status) => {
            let rss = status.vmrss.map(|kib| kib * 1024);
            eprintln!(
                "hs-load fanout: server pid {pid} ({}) VmRSS {when}: {:.1} MiB",
                status.name,
                rss.unwrap_or(0) as f64 / (1 << 20) as f64
            );
            rss
        }
        Err(error) => {
            eprintln!("hs-load fanout: cannot read /proc/{pid}/status: {error}");
            None
        }
    }
}

/// User + system CPU time a process (`None`: this one) has used so far, all threads.
#[cfg(target_os = "linux")]
pub(super) fn process_cpu(pid: Option<u32>) -> Option<Duration> {
    let process = match pid {
        None => procfs::process::Process::myself(),
        Some(pid) => procfs::process::Process::new(i32::try_from(pid).ok()?),
    }
    .ok()?;
    let stat = process.stat().ok()?;
    let ticks = stat.utime + stat.stime;
    Some(Duration::from_secs_f64(
        ticks as f64 / procfs::ticks_per_second() as f64,
    ))
}

/// Without `/proc` the run reports no memory or CPU figures.
#[cfg(not(target_os = "linux"))]
pub(super) fn read_rss(_pid: u32, _when: &str) -> Option<u64> {
    None
}

#[cfg(not(target_os = "linux"))]
pub(super) fn process_cpu(_pid: Option<u32>) -> Option<Duration> {
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(read_rss(std::process::id(), "now").is_some_and(|rss| rss > 0));
        assert!(process_cpu(None).is_some());
        assert!(process_cpu(Some(std::process::id())).is_some());
    }
}
