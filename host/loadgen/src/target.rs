//! The `--url` guard: which server a run may talk to.
//!
//! The load generator sends tens of thousands of requests per second, so it only ever
//! talks to plain HTTP on a loopback address (`127.0.0.1`, `localhost`, `[::1]`). The URL
//! names a server, not a resource: a path other than `/` is refused rather than ignored.
//! `localhost` is mapped to 127.0.0.1 here, without asking a resolver.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hyper::Uri;

/// A server the load generator may talk to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The `Host` header value: the URL's authority as given (e.g. `localhost:6286`).
    pub authority: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UrlError {
    #[error("`{0}` is not a valid URL")]
    Invalid(String),
    #[error("only plain `http://` URLs are supported")]
    Scheme,
    #[error("the URL must not carry user information")]
    UserInfo,
    #[error("invalid port in `{0}`")]
    Port(String),
    #[error("refusing to load `{0}`: only 127.0.0.1, localhost and [::1] are allowed")]
    NotLoopback(String),
    #[error("the URL names a server: give no path or query (got `{0}`)")]
    HasPath(String),
}

impl Target {
    /// Parses and checks a `--url` value.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let uri: Uri = url.parse().map_err(|_| UrlError::Invalid(url.to_owned()))?;
        if uri.scheme_str() != Some("http") {
            return Err(UrlError::Scheme);
        }
        let authority = uri
            .authority()
            .ok_or_else(|| UrlError::Invalid(url.to_owned()))?;
        if authority.as_str().contains('@') {
            return Err(UrlError::UserInfo);
        }
        let ip: IpAddr = match authority.host() {
            "127.0.0.1" => Ipv4Addr::LOCALHOST.into(),
            "[::1]" => Ipv6Addr::LOCALHOST.into(),
            host if host.eq_ignore_ascii_case("localhost") => Ipv4Addr::LOCALHOST.into(),
            other => return Err(UrlError::NotLoopback(other.to_owned())),
        };
        // `Authority::port` silently yields nothing for an out-of-range port: read the text.
        let port = match authority.as_str().get(authority.host().len()..) {
            Some("") => 80,
            Some(rest) => rest
                .strip_prefix(':')
                .filter(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse::<u16>().ok())
                .filter(|port| *port != 0)
                .ok_or_else(|| UrlError::Port(url.to_owned()))?,
            None => return Err(UrlError::Invalid(url.to_owned())),
        };
        let path_and_query = uri.path_and_query().map_or("", |pq| pq.as_str());
        if !matches!(path_and_query, "" | "/") {
            return Err(UrlError::HasPath(path_and_query.to_owned()));
        }
        Ok(Self {
            addr: SocketAddr::new(ip, port),
            authority: authority.as_str().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn accepts_loopback_forms() {
        let t = Target::parse("http://127.0.0.1:6286").unwrap();
        assert_eq!(t.addr, addr("127.0.0.1:6286"));
        assert_eq!(t.authority, "127.0.0.1:6286");

        let t = Target::parse("http://localhost:8080/").unwrap();
        assert_eq!(t.addr, addr("127.0.0.1:8080"));
        assert_eq!(t.authority, "localhost:8080");

        let t = Target::parse("http://LocalHost:1").unwrap();
        assert_eq!(t.addr, addr("127.0.0.1:1"));

        let t = Target::parse("http://[::1]:9000").unwrap();
        assert_eq!(t.addr, addr("[::1]:9000"));
        assert_eq!(t.authority, "[::1]:9000");

        assert_eq!(
            Target::parse("http://127.0.0.1").unwrap().addr,
            addr("127.0.0.1:80")
        );
    }

    #[test]
    fn refuses_other_hosts() {
        for url in [
            "http://10.0.0.1:80",
            "http://example.com",
            "http://127.0.0.2:80",
            "http://0.0.0.0:80",
            "http://localhost.example.com:80",
            "http://[::2]:80",
            "http://[::ffff:127.0.0.1]:80",
        ] {
            assert!(
                matches!(Target::parse(url), Err(UrlError::NotLoopback(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn refuses_other_shapes() {
        assert_eq!(
            Target::parse("https://127.0.0.1:443"),
            Err(UrlError::Scheme)
        );
        assert_eq!(Target::parse("127.0.0.1:80"), Err(UrlError::Scheme));
        assert_eq!(
            Target::parse("http://user@127.0.0.1:80"),
            Err(UrlError::UserInfo)
        );
        assert!(matches!(
            Target::parse("http://user@example.com@127.0.0.1:80"),
            Err(UrlError::UserInfo | UrlError::Invalid(_))
        ));
        assert_eq!(
            Target::parse("http://127.0.0.1:80/pub/x"),
            Err(UrlError::HasPath("/pub/x".into()))
        );
        assert_eq!(
            Target::parse("http://127.0.0.1:80/?a=1"),
            Err(UrlError::HasPath("/?a=1".into()))
        );
        let too_big = Target::parse("http://127.0.0.1:99999");
        assert!(
            matches!(too_big, Err(UrlError::Port(_) | UrlError::Invalid(_))),
            "{too_big:?}"
        );
        for url in [
            "http://127.0.0.1:0",
            "http://127.0.0.1:",
            "http://localhost:+80",
        ] {
            assert!(
                matches!(
                    Target::parse(url),
                    Err(UrlError::Port(_) | UrlError::Invalid(_))
                ),
                "{url}"
            );
        }
        assert!(matches!(
            Target::parse("not a url"),
            Err(UrlError::Invalid(_))
        ));
    }
}
