//! An NBD client's bytes through the server: the handshake, then the transmission phase.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;

use rustix::net::{send, SendFlags};
use sectorcrypt_nbd::{serve_connection, ServerOptions};
use sectorcrypt_storage::MemStorage;
use sectorcrypt_volume::{Layout, Volume, VolumeOptions};

/// The exported volume: 64 KiB, so that requests inside and past its end are both near.
const VOLUME_BYTES: usize = 64 << 10;

/// The input as everything a client sends on one connection (greeting flags, options, then
/// requests with their payloads), served against a 64 KiB volume in memory with discards
/// allowed; the server's replies are read and dropped. Returns when the server has finished
/// with the connection, which it must once the client's bytes end.
pub fn nbd_session(data: &[u8]) {
    let layout = Layout {
        offset: 0,
        size: VOLUME_BYTES as u64,
        cipher: "aes-xts-plain64".into(),
        sector_size: 512,
        iv_offset: 0,
    };
    let options = VolumeOptions {
        allow_discards: true,
        ..VolumeOptions::default()
    };
    let storage = Arc::new(MemStorage::new(vec![0; VOLUME_BYTES]));
    let Ok(volume) = Volume::with_layout(storage, layout, &[7; 64], &options) else {
        return;
    };
    let Ok((server, client)) = UnixStream::pair() else {
        return;
    };
    let Ok(mut replies) = client.try_clone() else {
        return;
    };
    let request = data.to_vec();
    // The client's bytes, then the end of its stream. NOSIGNAL: a server that hung up early is
    // an error here, not a SIGPIPE (libFuzzer's process does not ignore it).
    let sender = thread::spawn(move || {
        let mut rest = &request[..];
        while !rest.is_empty() {
            match send(&client, rest, SendFlags::NOSIGNAL) {
                Ok(n) if n > 0 => rest = &rest[n..],
                _ => break,
            }
        }
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    let reader = thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = replies.read_to_end(&mut sink);
    });
    let serve_options = ServerOptions {
        export_name: "fuzz".into(),
        // One worker: requests run in the order they were read, so a run is reproducible.
        workers: 1,
        ..ServerOptions::default()
    };
    let _ = serve_connection(server, Arc::new(volume), &serve_options);
    let _ = sender.join();
    let _ = reader.join();
}
