//! The baseline: a bare hyper 1.x HTTP/1.1 server that answers every request with the
//! same body. No routing, no auth, no storage: measuring it with the same client and on
//! the same cores gives the ceiling against which the homeserver's figures are read.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_PAUSE: Duration = Duration::from_millis(10);

/// Serves until the task is dropped. Each connection runs on its own task.
pub async fn serve(listener: TcpListener, body: Bytes) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                eprintln!("hs-load baseline: accept: {error}");
                tokio::time::sleep(ACCEPT_PAUSE).await;
                continue;
            }
        };
        // Small responses: without this, Nagle + delayed ACK adds ~40 ms stalls.
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| respond(request, body.clone()));
            // A client hanging up mid-request is normal at the end of a run.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(
    request: Request<Incoming>,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read (and drop) any request body so the connection stays usable for keep-alive.
    let mut incoming = request.into_body();
    while let Some(Ok(_)) = incoming.frame().await {}
    let mut response = Response::new(Full::new(body));
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{RunConfig, run};
    use crate::scenario::Scenario;
    use crate::target::Target;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn static_scenario_against_the_baseline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, Bytes::from_static(b"hello")));
        let summary = run(RunConfig {
            also: Vec::new(),
            target: Target::parse(&format!("http://{addr}")).unwrap(),
            scenario: Scenario::Static,
            connections: 3,
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(400),
        })
        .await
        .unwrap();
        server.abort();
        assert!(summary.requests > 0, "{summary:?}");
        assert_eq!(summary.errors, 0, "{summary:?}");
        assert_eq!(summary.statuses.get(&200), Some(&summary.requests));
    }

    #[tokio::test]
    async fn setup_failure_is_reported_with_the_answer() {
        // The baseline answers 200 to everything, so point the run at a server that
        // answers 404 instead: a tiny service built the same way.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(|_req: Request<Incoming>| async {
                let mut r =
                    Response::new(Full::new(Bytes::from_static(b"{\"error\":\"not_found\"}")));
                *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                Ok::<_, Infallible>(r)
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let error = run(RunConfig {
            also: Vec::new(),
            target: Target::parse(&format!("http://{addr}")).unwrap(),
            scenario: Scenario::Put1k,
            connections: 1,
            warmup: Duration::ZERO,
            duration: Duration::from_millis(100),
        })
        .await
        .unwrap_err();
        server.abort();
        let text = error.to_string();
        assert!(text.contains("POST /signup answered 404"), "{text}");
        assert!(text.contains("not_found"), "{text}");
    }
}
