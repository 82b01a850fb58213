//! What the process does to keep its keys (sectorcrypt-secret holds each one in locked pages left
//! out of core dumps): no core dumps and no debugger of the same user, one warning if the lock
//! limit is too small, and with `--verbose` how much is locked once the keys are in place.

use std::sync::atomic::{AtomicBool, Ordering};

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// Set up before any secret is read: every command may read a passphrase or a key.
pub(crate) fn protect_process(verbose: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
    sectorcrypt_secret::on_lock_failure(|e| {
        eprintln!(
            "sectorcrypt: WARNING: cannot lock memory holding keys ({e}); they may reach swap \
             (raise the limit with 'ulimit -l')"
        )
    });
    if let Err(e) = sectorcrypt_secret::forbid_core_dumps() {
        eprintln!("sectorcrypt: WARNING: cannot forbid core dumps of this process: {e}");
    }
}

/// Whether `--verbose` was given (for the reasons a token was passed over, too).
pub(crate) fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// The keys are in place: wipe what unlocking left on this thread's stack, and say (with
/// `--verbose`) how much key memory is locked. Called from the frame that did the unlocking, so
/// the frames below it, where the key schedules and hashes ran, are the ones overwritten.
pub(crate) fn keys_ready() {
    sectorcrypt_secret::scrub_stack();
    if verbose() {
        eprintln!(
            "sectorcrypt: {} KiB of memory holding keys is locked",
            sectorcrypt_secret::locked_bytes() / 1024
        );
    }
}
