//! The physical reference for crosstalk's durable POST (issue #57): the relay's own stack with
//! none of the relay's own work. One route, `POST /api/channels/{channel}/messages`, parses the
//! post once; one store thread takes every post queued meanwhile, writes them in one sled batch
//! with one flush, and then answers each poster with its id. With `--no-store` a post is
//! answered once it is parsed (HTTP alone). It is set up as the relay sets itself up: actix-web
//! with a worker per core and `tcp_nodelay`, jemalloc, and the vendored sled with the relay's
//! cache, background flush and mode (`actors/src/sled_store.rs`).
//!
//!   crosstalk-reference serve --host 127.0.0.1 --port 0 --data-dir DIR [--no-store]
//!
//! It says `crosstalk listening on http://ADDR` as the relay does, and answers `GET /healthz`,
//! so the benchmark starts and probes it as it does the relay. Loopback only, as every server
//! the benchmark starts.

use actix_web::{web, App, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use tokio::sync::oneshot;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The relay's sled settings (`actors/src/sled_store.rs`).
const CACHE_BYTES: u64 = 2 * 1024 * 1024;
const BACKGROUND_FLUSH_MS: u64 = 500;

/// A post as the relay reads one: the fields the benchmark's load sends, and the others a post
/// may carry.
#[derive(Debug, Deserialize, Serialize)]
struct Post {
    sender: String,
    body: String,
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    recipient: Option<String>,
    #[serde(default)]
    reply_to: Option<u64>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

#[derive(Serialize)]
struct Stored<'a> {
    id: u64,
    channel: &'a str,
}

struct Job {
    channel: String,
    post: Post,
    answer: oneshot::Sender<Result<u64, String>>,
}

/// Where posts go: the store thread, or nowhere (`--no-store`).
enum Sink {
    Store(mpsc::Sender<Job>),
    Nowhere(AtomicU64),
}

/// Takes every queued post, writes them as one batch with one flush, answers each.
fn store_thread(db: sled::Db, rx: mpsc::Receiver<Job>) {
    let mut last = 0u64;
    let mut round: Vec<Job> = Vec::new();
    while let Ok(first) = rx.recv() {
        round.push(first);
        round.extend(rx.try_iter());
        let mut batch = sled::Batch::default();
        let mut ids = Vec::with_capacity(round.len());
        for job in &round {
            last += 1;
            let mut key = Vec::with_capacity(job.channel.len() + 10);
            key.push(b'e');
            key.extend_from_slice(job.channel.as_bytes());
            key.push(0);
            key.extend_from_slice(&last.to_be_bytes());
            match postcard::to_allocvec(&job.post) {
                Ok(value) => batch.insert(key, value),
                Err(_) => continue,
            }
            ids.push(last);
        }
        let result = db
            .apply_batch(batch)
            .and_then(|()| db.flush().map(|_| ()))
            .map_err(|e| e.to_string());
        for (job, id) in round.drain(..).zip(ids) {
            let _ = job.answer.send(result.clone().map(|()| id));
        }
    }
}

fn refused(status: actix_web::http::StatusCode, why: String) -> HttpResponse {
    HttpResponse::build(status).json(serde_json::json!({ "error": why }))
}

async fn post(channel: web::Path<String>, body: web::Bytes, sink: web::Data<Sink>) -> HttpResponse {
    let post: Post = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return refused(actix_web::http::StatusCode::BAD_REQUEST, e.to_string()),
    };
    let channel = channel.into_inner();
    let id = match sink.get_ref() {
        Sink::Nowhere(last) => last.fetch_add(1, Ordering::Relaxed) + 1,
        Sink::Store(tx) => {
            let (answer, rx) = oneshot::channel();
            if tx
                .send(Job {
                    channel: channel.clone(),
                    post,
                    answer,
                })
                .is_err()
            {
                return refused(actix_web::http::StatusCode::SERVICE_UNAVAILABLE, "store stopped".into());
            }
            match rx.await {
                Ok(Ok(id)) => id,
                Ok(Err(e)) => return refused(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR, e),
                Err(_) => return refused(actix_web::http::StatusCode::SERVICE_UNAVAILABLE, "store stopped".into()),
            }
        }
    };
    HttpResponse::Ok().json(Stored { id, channel: &channel })
}

/// `serve --host H --port P --data-dir D [--no-store]`, as the relay takes them.
struct Args {
    host: String,
    port: u16,
    data_dir: PathBuf,
    store: bool,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    if it.next().as_deref() != Some("serve") {
        return Err("usage: crosstalk-reference serve --host H --port P --data-dir DIR [--no-store]".into());
    }
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 0,
        data_dir: PathBuf::from("reference-data"),
        store: true,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => a.host = value()?,
            "--port" => a.port = value()?.parse().map_err(|e| format!("--port: {e}"))?,
            "--data-dir" => a.data_dir = PathBuf::from(value()?),
            "--no-store" => a.store = false,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() -> std::io::Result<()> {
    let a = args().map_err(std::io::Error::other)?;
    let sink = if a.store {
        let db = sled::Config::new()
            .path(a.data_dir.join("reference.sled"))
            .cache_capacity(CACHE_BYTES)
            .flush_every_ms(Some(BACKGROUND_FLUSH_MS))
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(std::io::Error::other)?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("reference-store".into())
            .spawn(move || store_thread(db, rx))?;
        Sink::Store(tx)
    } else {
        Sink::Nowhere(AtomicU64::new(0))
    };
    let sink = web::Data::new(sink);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    actix_web::rt::System::new().block_on(async move {
        let server = HttpServer::new(move || {
            App::new()
                .app_data(sink.clone())
                .route("/healthz", web::get().to(|| async { HttpResponse::Ok().body("ok") }))
                .route("/api/channels/{channel}/messages", web::post().to(post))
        })
        .workers(workers)
        .tcp_nodelay(true)
        .bind((a.host.as_str(), a.port))?;
        for addr in server.addrs() {
            println!("crosstalk listening on http://{addr}");
        }
        server.run().await
    })
}
