//! Request targets: the URL a request goes to and the target string that is signed.
//!
//! The signature covers the request target exactly as sent (path plus `?query`). The
//! target is therefore read back from the final [`Url`] — the same value the HTTP stack
//! puts on the request line — rather than assembled separately, so a query the URL
//! library re-encodes can never make the signed and the sent target differ.

use url::Url;
use url::form_urlencoded;

/// Paging and shape of a listing (`GET /pub/dir/`): the protocol's [`ListQuery`]
/// (`limit` 1..=1000, the server's default 100; `cursor` from the previous page's
/// [`ListResult`](crate::ListResult); `reverse`; `shallow`).
///
/// [`ListQuery`]: homeserver_protocol::query::ListQuery
pub use homeserver_protocol::query::ListQuery as ListOptions;

/// Where a request goes, and the target string its signature covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTarget {
    pub url: Url,
    pub target: String,
}

impl RequestTarget {
    /// `path` must start with `/`; `query` is already encoded (no leading `?`).
    pub fn new(base: &Url, path: &str, query: Option<&str>) -> Self {
        let mut url = base.clone();
        url.set_path(path);
        url.set_query(query);
        let target = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        Self { url, target }
    }
}

/// Query of `POST /signup`. The token is sent trimmed and in upper case: tokens are
/// made as `XXXX-XXXX-XXXX` (upper-case base32), and people copy them in any case.
pub fn signup_query(token: Option<&str>) -> Option<String> {
    token.map(|t| {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("signup_token", &t.trim().to_ascii_uppercase())
            .finish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url::parse("http://127.0.0.1:6286").unwrap()
    }

    #[test]
    fn default_list_options_have_no_query() {
        assert_eq!(ListOptions::default().to_query(), None);
        let t = RequestTarget::new(&base(), "/pub/dir/", None);
        assert_eq!(t.target, "/pub/dir/");
        assert_eq!(t.url.as_str(), "http://127.0.0.1:6286/pub/dir/");
    }

    #[test]
    fn query_is_part_of_the_signed_target() {
        let opts = ListOptions {
            limit: Some(10),
            cursor: Some("L3B1Yi9h".into()),
            reverse: true,
            shallow: true,
        };
        let query = opts.to_query().unwrap();
        assert_eq!(query, "limit=10&cursor=L3B1Yi9h&reverse=true&shallow=true");
        let t = RequestTarget::new(&base(), "/pub/dir/", Some(&query));
        assert_eq!(
            t.target,
            "/pub/dir/?limit=10&cursor=L3B1Yi9h&reverse=true&shallow=true"
        );
        assert_eq!(
            t.url.as_str(),
            "http://127.0.0.1:6286/pub/dir/?limit=10&cursor=L3B1Yi9h&reverse=true&shallow=true"
        );
    }

    #[test]
    fn odd_cursor_is_encoded_once_and_signed_as_sent() {
        // A cursor is opaque: it may hold characters that must be escaped in a query.
        let opts = ListOptions {
            cursor: Some("a+b/c=d&e f#g\"h".into()),
            ..Default::default()
        };
        let query = opts.to_query().unwrap();
        let t = RequestTarget::new(&base(), "/pub/", Some(&query));
        // What is signed is byte for byte what goes on the request line.
        let uri: reqwest::Url = t.url.clone();
        let sent = format!("{}?{}", uri.path(), uri.query().unwrap());
        assert_eq!(t.target, sent);
        assert_eq!(t.target, "/pub/?cursor=a%2Bb%2Fc%3Dd%26e+f%23g%22h");
        // And the server decodes it back to the original.
        let decoded: Vec<(String, String)> =
            form_urlencoded::parse(t.url.query().unwrap().as_bytes())
                .into_owned()
                .collect();
        assert_eq!(decoded, vec![("cursor".into(), "a+b/c=d&e f#g\"h".into())]);
    }

    #[test]
    fn signed_target_matches_http_request_line() {
        let query = ListOptions {
            limit: Some(1),
            cursor: Some("x y".into()),
            ..Default::default()
        }
        .to_query();
        let t = RequestTarget::new(&base(), "/pub/a/", query.as_deref());
        let request = reqwest::Client::new().get(t.url.clone()).build().unwrap();
        let uri: http::Uri = request.url().as_str().parse().unwrap();
        assert_eq!(uri.path_and_query().unwrap().as_str(), t.target);
    }

    #[test]
    fn signup_token_query() {
        assert_eq!(signup_query(None), None);
        let q = signup_query(Some("ABCD-EFGH-JKMN")).unwrap();
        let t = RequestTarget::new(&base(), "/signup", Some(&q));
        assert_eq!(t.target, "/signup?signup_token=ABCD-EFGH-JKMN");
        // Typed or pasted in lower case, with stray spaces: normalised.
        assert_eq!(
            signup_query(Some(" abcd-efgh-jkmn\n")),
            Some("signup_token=ABCD-EFGH-JKMN".into())
        );
    }

    #[test]
    fn base_with_trailing_slash() {
        let base = Url::parse("https://hs.example.org/").unwrap();
        let t = RequestTarget::new(&base, "/pub/a.txt", None);
        assert_eq!(t.url.as_str(), "https://hs.example.org/pub/a.txt");
        assert_eq!(t.target, "/pub/a.txt");
    }
}
