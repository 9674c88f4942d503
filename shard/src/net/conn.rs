//! Accepting client connections and serving one connection: read a frame,
//! check it, dispatch it, write the reply. Requests on one connection are
//! answered in order, one at a time; clients use several connections for
//! parallelism.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};
use ringlog_protocol::wire::{
    decode_frame_header, Body, ErrorCode, HelloReply, Opcode, Reply, Request, FRAME_HEADER_LEN,
    PROTOCOL_VERSION,
};

use crate::metrics;
use crate::shard::Shard;

pub(crate) async fn accept_loop(shard: Rc<Shard>, listener: TcpListener) {
    loop {
        if shard.is_stopping() {
            break;
        }
        let accepted = monoio::select! {
            r = listener.accept() => Some(r),
            _ = shard.stop.notified() => None,
        };
        let Some(result) = accepted else { break };
        let (stream, peer) = match result {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(shard = shard.id, error = %e, "accept failed");
                monoio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let open = shard.metrics.connections_open.load(Ordering::Relaxed);
        if open >= shard.config.connections_per_shard_max as u64 {
            metrics::inc(&shard.metrics.connections_refused_total);
            monoio::spawn(refuse(stream));
            continue;
        }
        metrics::inc(&shard.metrics.connections_total);
        shard
            .metrics
            .connections_open
            .fetch_add(1, Ordering::Relaxed);
        let s = shard.clone();
        monoio::spawn(async move {
            let _ = stream.set_nodelay(true);
            tracing::debug!(shard = s.id, %peer, "connection");
            serve(&s, stream).await;
            s.metrics.connections_open.fetch_sub(1, Ordering::Relaxed);
        });
    }
    tracing::info!(shard = shard.id, "stopped accepting connections");
}

async fn refuse(mut stream: TcpStream) {
    let reply = Reply::error(
        Opcode::Hello as u16,
        0,
        ErrorCode::Backpressure,
        "too many connections on this shard; retry later",
    );
    let _ = write_reply(&mut stream, &reply).await;
}

async fn write_reply(stream: &mut TcpStream, reply: &Reply) -> std::io::Result<()> {
    let mut out = Vec::new();
    if let Err(e) = reply.encode(&mut out) {
        tracing::error!(error = %e, "reply does not encode");
        let fallback = Reply::error(
            reply.opcode,
            reply.correlation,
            ErrorCode::Internal,
            e.to_string(),
        );
        out.clear();
        fallback
            .encode(&mut out)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    let (res, _) = stream.write_all(out).await;
    res.map(|_| ())
}

/// Serves one connection until it closes, errs, or the shard stops.
async fn serve(shard: &Shard, mut stream: TcpStream) {
    let mut greeted = false;
    let frame_max = shard.config.frame_bytes_max;
    loop {
        if shard.is_stopping() {
            let r = Reply::error(0, 0, ErrorCode::ShuttingDown, "server shutting down");
            let _ = write_reply(&mut stream, &r).await;
            return;
        }
        let (res, head) = stream.read_exact(vec![0u8; FRAME_HEADER_LEN]).await;
        if res.is_err() {
            return; // closed or reset
        }
        let mut head_arr = [0u8; FRAME_HEADER_LEN];
        head_arr.copy_from_slice(&head);
        let header = match decode_frame_header(&head_arr, frame_max) {
            Ok(h) => h,
            Err(e) => {
                metrics::inc(&shard.metrics.bad_frames_total);
                let _ =
                    write_reply(&mut stream, &Reply::error(0, 0, e.code(), e.to_string())).await;
                return;
            }
        };
        let (res, body) = stream.read_exact(vec![0u8; header.body_len as usize]).await;
        if res.is_err() {
            return;
        }
        if let Err(e) = header.verify(&body) {
            metrics::inc(&shard.metrics.bad_frames_total);
            let _ = write_reply(&mut stream, &Reply::error(0, 0, e.code(), e.to_string())).await;
            return;
        }
        let (correlation, opcode, decoded) = Request::decode(&body);
        drop(body);
        let reply = match decoded {
            Err(e) => {
                metrics::inc(&shard.metrics.bad_frames_total);
                Reply::error(opcode, correlation, e.code(), e.to_string())
            }
            Ok(Request::Hello {
                version_min,
                version_max,
                client,
            }) => {
                if (version_min..=version_max).contains(&PROTOCOL_VERSION) {
                    greeted = true;
                    tracing::debug!(%client, "hello");
                    Reply::ok(
                        Opcode::Hello,
                        correlation,
                        Body::Hello(HelloReply {
                            version: PROTOCOL_VERSION,
                            frame_bytes_max: frame_max,
                            batch_bytes_max: shard.config.store_config().batch_bytes_max() as u32,
                            shards: shard.shard_count() as u16,
                        }),
                    )
                } else {
                    Reply::error(
                        opcode,
                        correlation,
                        ErrorCode::UnsupportedVersion,
                        format!(
                            "server speaks version {PROTOCOL_VERSION}, client asked for {version_min}..={version_max}"
                        ),
                    )
                }
            }
            Ok(_) if !greeted => Reply::error(
                opcode,
                correlation,
                ErrorCode::HandshakeRequired,
                "the first request must be Hello",
            ),
            Ok(req) => super::dispatch::handle(shard, correlation, req).await,
        };
        let closes = matches!(&reply.result, Err((code, _)) if code.closes_connection());
        if write_reply(&mut stream, &reply).await.is_err() || closes {
            return;
        }
    }
}
