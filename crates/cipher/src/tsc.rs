//! A cheap cycle counter for per-phase timing and cycles-per-byte figures.
//!
//! On x86-64 this is the time-stamp counter (constant rate on every CPU this project targets);
//! elsewhere nanoseconds from a monotonic clock, so "ticks" are nanoseconds there. Timing a
//! 512-byte request with `Instant` would cost as much as encrypting it; `rdtsc` costs ~20 cycles.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The current tick count.
#[inline]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` is available on every x86-64 CPU and has no memory effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Ticks per second, measured once against the monotonic clock (about 50 ms).
pub fn ticks_per_second() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        let t0 = Instant::now();
        let c0 = now();
        while t0.elapsed() < Duration::from_millis(50) {
            std::hint::spin_loop();
        }
        let c1 = now();
        (c1 - c0) as f64 / t0.elapsed().as_secs_f64()
    })
}
