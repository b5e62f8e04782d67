//! A request body read whole, in the handlers that take it as bytes.

use axum::body::{Body, Bytes, HttpBody};
use http_body_util::{BodyExt as _, Limited};

/// A body that could not be read whole.
#[derive(Debug)]
pub(crate) enum Unread {
    /// It is over the limit.
    TooLarge,
    /// The stream failed.
    Failed,
}

impl From<Unread> for crate::error::ApiError {
    /// 413 `PAYLOAD_TOO_LARGE` over the limit, else 400: every reader of a body answers alike.
    fn from(unread: Unread) -> Self {
        match unread {
            Unread::TooLarge => crate::error::ApiError::payload_too_large(),
            Unread::Failed => crate::error::ApiError::bad_request("the request body could not be read"),
        }
    }
}

/// The whole of `body`, at most `limit` bytes.
///
/// The usual body is one frame followed by its end: a small request's body arrives with its
/// headers, and the edge hands the handlers each body as one buffer (`Edge`). That frame is
/// the answer, taken in one poll; any other body is collected. Written here rather than with
/// `http_body_util`'s `collect` (or axum's `to_bytes` and `Bytes` extractor, which use it)
/// because `collect` gathers frames in a list and then takes the one buffer back out of it: a
/// list allocated and freed on every read, twice per request (the edge's read and the
/// handler's), about 1,500 instructions of a call.
pub(crate) async fn whole(body: Body, limit: usize) -> Result<Bytes, Unread> {
    let mut body = Limited::new(body, limit);
    // The limit's error, here or from a limit inside `body` (the extractors' limit), is
    // `TooLarge`, wherever in the chain of causes it lies.
    let unread = |e: Box<dyn std::error::Error + Send + Sync>| {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*e);
        while let Some(e) = cause {
            if e.is::<http_body_util::LengthLimitError>() {
                return Unread::TooLarge;
            }
            cause = e.source();
        }
        Unread::Failed
    };
    let first = loop {
        match body.frame().await {
            None => return Ok(Bytes::new()),
            // A frame that is not data (trailers) holds none of the body.
            Some(frame) => {
                if let Ok(data) = frame.map_err(unread)?.into_data() {
                    break data;
                }
            }
        }
    };
    if body.is_end_stream() {
        return Ok(first);
    }
    let rest = body.collect().await.map_err(unread)?.to_bytes();
    let mut all = Vec::with_capacity(first.len() + rest.len());
    all.extend_from_slice(&first);
    all.extend_from_slice(&rest);
    Ok(Bytes::from(all))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    /// A body that yields its chunks one frame each, then trailers.
    fn streamed(chunks: &[&'static [u8]]) -> Body {
        let frames = chunks
            .iter()
            .map(|c| Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(c))))
            .chain(std::iter::once(Ok(hyper::body::Frame::trailers(
                axum::http::HeaderMap::new(),
            ))))
            .collect::<Vec<_>>();
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames,
        )))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_frame_or_many() {
        assert_eq!(whole(Body::from("abc"), 3).await.unwrap(), "abc");
        assert_eq!(whole(Body::empty(), 0).await.unwrap(), "");
        assert_eq!(whole(streamed(&[b"ab", b"", b"cd"]), 4).await.unwrap(), "abcd");
        assert_eq!(whole(streamed(&[]), 4).await.unwrap(), "");
        assert_eq!(whole(streamed(&[b"abcd"]), 4).await.unwrap(), "abcd");
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused() {
        use axum::RequestExt as _;
        let limited = axum::http::Request::new(Body::from("abcd"))
            .with_limited_body()
            .into_body();
        assert_eq!(whole(limited, usize::MAX).await.unwrap(), "abcd");
        let mut request = axum::http::Request::new(streamed(&[b"ab", b"cd"]));
        axum::extract::DefaultBodyLimit::max(3).apply(&mut request);
        let limited = request.with_limited_body().into_body();
        assert!(matches!(whole(limited, usize::MAX).await, Err(Unread::TooLarge)));
        assert!(matches!(
            whole(Body::from("abcd"), 3).await,
            Err(Unread::TooLarge)
        ));
        assert!(matches!(
            whole(streamed(&[b"ab", b"cd"]), 3).await,
            Err(Unread::TooLarge)
        ));
        let failing = Body::new(http_body_util::StreamBody::new(futures_util::stream::iter([
            Ok(hyper::body::Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("reset")),
        ])));
        assert!(matches!(whole(failing, 8).await, Err(Unread::Failed)));
    }
}
