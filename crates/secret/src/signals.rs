//! The signals a command acts on (SIGINT, SIGTERM, SIGHUP), taken on a thread of their own and
//! never by a handler, so that no signal saves a keyed call's registers on its thread's stack.
//!
//! Before a signal handler runs, the kernel saves the interrupted thread's whole register file
//! (XSAVE) on that thread's stack, below its stack pointer, and leaves it there when the handler
//! returns. In the middle of a cipher call the registers hold round keys, and the frame lies
//! below the kernels' own frames by the size of the CPU's register state: 2.7 KiB with AVX-512,
//! over 11 KiB with AMX's tiles. That is past the stack a cipher call wipes after itself, which
//! is sized to the kernels' frames (a throw-away test of AES-XTS calls, each interrupted by a
//! no-op handler, found round keys 7-10 KiB below in 1-2% of them). How deep a stack wipe must
//! reach then depends on the CPU; with no handler it does not.
//!
//! So the commands install none: [`route`], called first in `main`, blocks the three in the main
//! thread, so in every thread started after it, and starts one thread that takes them with
//! `sigwaitinfo`, which saves no registers anywhere. Each one goes to the subscribers of its
//! number ([`subscribe`], [`channel`]); with none, it does what it would have done without us:
//! it ends the process, as that signal (or, if it was ignored when the process started, as
//! under `nohup`, nothing). A child process would inherit the mask (`std::process::Command`
//! keeps it across `fork` and `exec`): one we start gets the three unblocked again first
//! ([`unblock_in_child`]). `fuser` starts `fusermount3` itself to mount without root; that
//! helper keeps them blocked for the moment it runs, and acts on none.
//!
//! One handler of ours can still interrupt a keyed call and return: the storage's, for a mapped
//! file's page that fails under a cipher kernel. It runs on the thread's alternate stack, where
//! the saved registers stay; it says so ([`note_handler_ran`]), and the cipher's wipe after the
//! calls zeroes what it left ([`clear_after_handlers`]).
//!
//! A signal sent to one thread rather than to the process (`tgkill`; strace's fault injection
//! sends them so) waits blocked on that thread: only it can take it. Loops that check a stop flag
//! anyway (a conversion, at each step) call [`take_pending`] there; `kill`, a terminal and a
//! service manager signal the process, which the signals thread takes.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock, PoisonError};

pub use libc::{SIGHUP, SIGINT, SIGTERM};

/// The signals [`route`] takes: those a command of ours acts on.
pub const ROUTED: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// What a subscriber does with a signal, on the signals thread.
type Act = Box<dyn FnMut(i32) + Send>;

struct Subscriber {
    id: u64,
    signals: Vec<i32>,
    act: Act,
}

static SUBSCRIBERS: Mutex<Vec<Subscriber>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);
/// Whether the signals thread runs; the OS error number if it could not be started.
static ROUTER: OnceLock<Result<(), i32>> = OnceLock::new();
/// Which of [`ROUTED`] were ignored when the signals thread started.
static IGNORED: OnceLock<Vec<i32>> = OnceLock::new();

/// Block [`ROUTED`] in this thread, and so in every thread it starts from now on, and take them
/// on a thread of their own (started once per process). Call it first in `main`: a thread
/// started before it keeps the signals unblocked, and the kernel may give one to it, which then
/// ends the process whatever the subscriptions (the default action, with no handler installed).
pub fn route() -> io::Result<()> {
    let routed = set_of(&ROUTED);
    // SAFETY: `routed` is an initialised signal set; the old mask is not asked for.
    let blocked =
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const routed, std::ptr::null_mut()) };
    if blocked != 0 {
        return Err(io::Error::from_raw_os_error(blocked));
    }
    ROUTER
        .get_or_init(|| start(routed))
        .map_err(io::Error::from_raw_os_error)
}

/// Called while a [`Subscription`] lives, on the signals thread, with each of `signals` that
/// arrives; while one lives, the signal does not end the process. `act` runs with the
/// subscribers locked: it must be quick (set a flag, send on a channel), and must neither
/// subscribe nor drop a subscription.
pub fn subscribe(
    signals: &[i32],
    act: impl FnMut(i32) + Send + 'static,
) -> io::Result<Subscription> {
    route()?;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    subscribers().push(Subscriber {
        id,
        signals: signals.to_vec(),
        act: Box::new(act),
    });
    Ok(Subscription { id })
}

/// Take one of [`ROUTED`] pending for this thread, if any, and hand it on as the signals thread
/// would (one system call). For a signal sent to this thread alone, which the signals thread
/// cannot take; see the module's documentation.
pub fn take_pending() {
    if ROUTER.get().is_none() {
        return; // nothing blocked, nothing held back
    }
    let routed = set_of(&ROUTED);
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `routed` is an initialised signal set and `now` a valid timeout; the signal's
    // details are not asked for.
    let signal = unsafe { libc::sigtimedwait(&raw const routed, std::ptr::null_mut(), &now) };
    if signal > 0 {
        hand_on(signal);
    }
}

/// Have `cmd`'s process start with [`ROUTED`] unblocked, as it would without [`route`]: a child
/// inherits its parent's signal mask across `fork` and `exec`, and a program started with SIGINT
/// blocked ignores the terminal's Ctrl-C.
pub fn unblock_in_child(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    let routed = set_of(&ROUTED);
    // SAFETY: the hook runs in the child between `fork` and `exec` and makes one
    // async-signal-safe call (`sigprocmask`) on a set copied into it; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sigprocmask(libc::SIG_UNBLOCK, &raw const routed, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// This thread's alternate signal stack, where a handler installed with `SA_ONSTACK` runs (Rust's
/// for SIGSEGV and SIGBUS, the storage's SIGBUS handler for mapped files): its address and size,
/// or `None` when the thread has none or is running on it now.
pub fn alt_stack() -> Option<(usize, usize)> {
    let mut now = std::mem::MaybeUninit::<libc::stack_t>::zeroed();
    // SAFETY: a query only (no new stack); `now` is written by the call.
    let queried = unsafe { libc::sigaltstack(std::ptr::null(), now.as_mut_ptr()) };
    // SAFETY: zero-initialised, and filled in by a successful call.
    let now = unsafe { now.assume_init() };
    let off = libc::SS_DISABLE | libc::SS_ONSTACK;
    (queried == 0 && now.ss_flags & off == 0 && !now.ss_sp.is_null())
        .then_some((now.ss_sp as usize, now.ss_size))
}

/// Handlers of ours that ran, process-wide: see [`note_handler_ran`].
static HANDLED: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// [`HANDLED`] when this thread last cleared what handlers leave.
    static CLEARED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Called by a signal handler of ours that may interrupt a keyed call (async-signal-safe: one
/// atomic add). The commands install only one: the storage's, for a mapped file's page that
/// fails under a request (a file truncated by another process, a disk error), in the middle of
/// a cipher kernel reading or writing it; the kernel then saves that kernel's registers, round
/// keys among them, where the handler runs, and leaves them there when it returns.
pub fn note_handler_ran() {
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

/// After keyed work, from a frame above it: if a handler of ours ran anywhere since this thread
/// last looked ([`note_handler_ran`]), zero what one may have left on this thread: its
/// alternate signal stack ([`alt_stack`]), and, for a thread without one, 128 KiB of its stack
/// below the caller, where the saved registers then lie (below the interrupted frames, by the
/// CPU's register state size: at most 11 KiB with AMX). Otherwise one atomic load: the cipher's
/// wipe after every request calls it.
#[inline]
pub fn clear_after_handlers() {
    let handled = HANDLED.load(Ordering::Relaxed);
    if handled != CLEARED.with(std::cell::Cell::get) {
        CLEARED.with(|c| c.set(handled));
        clear_handler_frames();
    }
}

#[inline(never)]
#[cold]
fn clear_handler_frames() {
    if let Some((at, len)) = alt_stack() {
        for i in 0..len {
            // SAFETY: the alternate stack is `len` bytes of writable memory at `at` (the kernel
            // writes signal frames there), which no handler uses now: this thread is not on it
            // (`alt_stack`), and a handler interrupting the loop runs to its end before the
            // loop goes on. Volatile, so that the stores are not dropped as never read; a byte
            // at a time, as the stack need not be aligned (a rare path: a few microseconds).
            unsafe { std::ptr::write_volatile((at as *mut u8).add(i), 0) };
        }
    }
    crate::scrub_stack();
}

/// [`subscribe`], each signal sent on the returned channel.
pub fn channel(signals: &[i32]) -> io::Result<(Subscription, mpsc::Receiver<i32>)> {
    let (tx, rx) = mpsc::channel();
    let subscription = subscribe(signals, move |signal| {
        let _ = tx.send(signal);
    })?;
    Ok((subscription, rx))
}

/// Ends its subscription when dropped: its `act` (and a [`channel`]'s sender) is dropped, and
/// the signals it took have their usual effect again unless another subscription takes them.
#[must_use = "the subscription ends when this is dropped"]
pub struct Subscription {
    id: u64,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let gone = {
            let mut subscribers = subscribers();
            let at = subscribers.iter().position(|s| s.id == self.id);
            at.map(|at| subscribers.remove(at))
        };
        // Dropped outside the lock: a channel's sender wakes its receiver as it goes.
        drop(gone);
    }
}

fn subscribers() -> std::sync::MutexGuard<'static, Vec<Subscriber>> {
    SUBSCRIBERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Start the signals thread, from a thread that blocks `routed` (it inherits the mask).
fn start(routed: libc::sigset_t) -> Result<(), i32> {
    // As under `nohup`: a signal ignored from the start stays ignored unless subscribed to. It
    // must be remembered: a blocked signal is queued even when ignored.
    IGNORED.get_or_init(|| ROUTED.into_iter().filter(|&s| is_ignored(s)).collect());
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || take(&routed))
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))
}

/// The signals thread: wait for the next of `routed` and hand it on.
fn take(routed: &libc::sigset_t) {
    loop {
        // SAFETY: `routed` is an initialised signal set, blocked in this thread (inherited from
        // the thread that started it); the signal's details are not asked for.
        let signal = unsafe { libc::sigwaitinfo(routed, std::ptr::null_mut()) };
        if signal > 0 {
            hand_on(signal);
        } // else EINTR: a signal outside the set interrupted the wait
    }
}

/// Give `signal` to its subscribers, or with none act as the process would have without us.
fn hand_on(signal: i32) {
    let mut taken = false;
    for subscriber in subscribers().iter_mut() {
        if subscriber.signals.contains(&signal) {
            (subscriber.act)(signal);
            taken = true;
        }
    }
    let ignored = IGNORED.get().is_some_and(|i| i.contains(&signal));
    if !taken && !ignored {
        end_by(signal);
    }
}

/// End the process as `signal` would have with its default action: unblocked on this thread
/// with no handler, sent to this thread.
fn end_by(signal: i32) -> ! {
    let only = set_of(&[signal]);
    // SAFETY: plain calls with an initialised signal set; resetting the disposition to the
    // default installs no handler.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const only, std::ptr::null_mut());
        libc::raise(signal);
    }
    // Not reached for SIGINT, SIGTERM or SIGHUP, whose default is to end the process.
    std::process::exit(128 + signal)
}

fn set_of(signals: &[i32]) -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `sigemptyset` initialises the set; `sigaddset` with a valid signal number only
    // sets its bit.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &signal in signals {
            libc::sigaddset(set.as_mut_ptr(), signal);
        }
        set.assume_init()
    }
}

fn is_ignored(signal: i32) -> bool {
    let mut now = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a query only (no new action); `now` is written by the call.
    let queried = unsafe { libc::sigaction(signal, std::ptr::null(), now.as_mut_ptr()) };
    // SAFETY: zero-initialised, and filled in by a successful call.
    queried == 0 && unsafe { now.assume_init() }.sa_sigaction == libc::SIG_IGN
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The tests that send signals, one at a time: each expects only its own.
    static SENDING: Mutex<()> = Mutex::new(());

    /// Sent to the signals thread itself (the test harness's other threads do not block the
    /// routed signals, and a process-wide one could end the test run): it reaches the
    /// subscriber, and a dropped subscription no longer does.
    #[test]
    fn a_signal_reaches_its_subscribers_until_they_unsubscribe() {
        let _one = SENDING.lock().unwrap_or_else(PoisonError::into_inner);
        let (subscription, signals) = channel(&[libc::SIGHUP]).unwrap();
        let (_other, others) = channel(&[libc::SIGHUP, libc::SIGTERM]).unwrap();
        send_to_signals_thread(libc::SIGHUP);
        let wait = Duration::from_secs(10);
        assert_eq!(signals.recv_timeout(wait), Ok(libc::SIGHUP));
        assert_eq!(others.recv_timeout(wait), Ok(libc::SIGHUP));
        drop(subscription);
        assert_eq!(
            signals.recv_timeout(wait),
            Err(mpsc::RecvTimeoutError::Disconnected),
            "a dropped subscription still has its sender"
        );
        send_to_signals_thread(libc::SIGHUP);
        assert_eq!(others.recv_timeout(wait), Ok(libc::SIGHUP));
    }

    #[test]
    fn the_routed_signals_are_blocked_in_threads_started_after_route() {
        // The harness's threads were started before: `route` is called in a new one, and the
        // mask read in a thread that one starts.
        let mask = std::thread::spawn(|| {
            route().unwrap();
            std::thread::spawn(|| {
                let mut mask = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
                // SAFETY: reads this thread's mask into `mask`.
                unsafe {
                    libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), mask.as_mut_ptr());
                    mask.assume_init()
                }
            })
            .join()
            .unwrap()
        });
        let mask = mask.join().unwrap();
        for signal in ROUTED {
            // SAFETY: a read of an initialised set.
            let member = unsafe { libc::sigismember(&raw const mask, signal) };
            assert_eq!(member, 1, "signal {signal} is not blocked in a new thread");
        }
    }

    /// A signal sent to one thread that blocks it waits there, where the signals thread cannot
    /// take it, until that thread asks.
    #[test]
    fn a_signal_sent_to_one_thread_waits_for_take_pending_there() {
        let _one = SENDING.lock().unwrap_or_else(PoisonError::into_inner);
        std::thread::spawn(|| {
            route().unwrap();
            let (_subscription, signals) = channel(&[SIGHUP]).unwrap();
            // SAFETY: sends a signal to this thread, which blocks it.
            let sent =
                unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), SIGHUP) };
            assert_eq!(sent, 0);
            assert_eq!(
                signals.recv_timeout(Duration::from_millis(200)),
                Err(mpsc::RecvTimeoutError::Timeout),
                "the signals thread took a signal sent to another thread"
            );
            take_pending();
            assert_eq!(signals.recv_timeout(Duration::from_secs(10)), Ok(SIGHUP));
        })
        .join()
        .unwrap();
    }

    /// A child inherits the blocked signals unless started through `unblock_in_child`.
    #[test]
    fn a_child_started_through_unblock_in_child_has_the_signals_unblocked() {
        let blocked_in = |unblock: bool| {
            std::thread::spawn(move || {
                route().unwrap();
                let mut cmd = std::process::Command::new("grep");
                cmd.args(["^SigBlk:", "/proc/self/status"]);
                if unblock {
                    unblock_in_child(&mut cmd);
                }
                let out = cmd.output().unwrap();
                let text = String::from_utf8(out.stdout).unwrap();
                let hex = text.trim().trim_start_matches("SigBlk:").trim().to_owned();
                u64::from_str_radix(&hex, 16).unwrap()
            })
            .join()
            .unwrap()
        };
        let routed = ROUTED.iter().fold(0u64, |m, &s| m | 1 << (s - 1));
        assert_eq!(
            blocked_in(false) & routed,
            routed,
            "inherited: the reason for the hook"
        );
        assert_eq!(blocked_in(true) & routed, 0);
    }

    /// `tgkill` to the thread named "signals", found in `/proc/self/task` (it names itself once
    /// it runs, so it is looked for again until it has).
    fn send_to_signals_thread(signal: i32) {
        route().unwrap();
        let find = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(Result::ok)
                .find(|task| {
                    std::fs::read_to_string(task.path().join("comm"))
                        .is_ok_and(|comm| comm.trim() == "signals")
                })
                .and_then(|task| task.file_name().to_str()?.parse::<i32>().ok())
        };
        let tid = (0..1000)
            .find_map(|_| {
                find().or_else(|| {
                    std::thread::sleep(Duration::from_millis(10));
                    None
                })
            })
            .expect("no signals thread");
        // SAFETY: sends a signal to a thread of this process, which blocks it and waits for it.
        let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, signal) };
        assert_eq!(sent, 0);
    }
}
