//! Registry authentication: `WWW-Authenticate` parsing, credentials from docker's
//! `config.json` (including `credHelpers`/`credsStore`, via the `docker_credential` crate),
//! the bearer-token flow and a token cache keyed by (host, scope).
//!
//! Flow: the first request to a host goes out anonymously. On 401 the challenge is parsed and
//! remembered per host; for `Bearer`, a token for the request's scope is fetched from the realm
//! (with Basic credentials when configured, or an identity token by OAuth2 refresh) and cached
//! until shortly before it expires; for `Basic`, the credentials are sent directly. Later
//! requests to a host with a known challenge get their authorization before being sent, so
//! they cost no extra 401 round trip. A 401 with a token is retried once after a refresh.

use crate::error::RegistryError;
use base64::Engine as _;
use docker_credential::{CredentialRetrievalError, DockerCredential};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A parsed `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// Token auth: fetch a token from `realm`.
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
    /// Send Basic credentials.
    Basic { realm: Option<String> },
}

/// Parse a `WWW-Authenticate` header value (`Bearer realm="..",service="..",scope=".."`).
/// Returns `None` for unknown schemes or a Bearer challenge without realm.
pub fn parse_www_authenticate(value: &str) -> Option<Challenge> {
    let value = value.trim();
    let (scheme, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    let params = parse_auth_params(rest);
    let get = |k: &str| {
        params
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    } else if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic {
            realm: get("realm"),
        })
    } else {
        None
    }
}

/// `k=v, k2="quoted, \"escaped\""` -> pairs.
fn parse_auth_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ',' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            continue;
        }
        while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
            chars.next();
        }
        let mut val = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            val.push(n)
                        }
                    }
                    '"' => break,
                    c => val.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                val.push(c);
                chars.next();
            }
        }
        out.push((key.trim().to_string(), val.trim().to_string()));
    }
    out
}

/// Credentials for one host.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// No credentials configured.
    Anonymous,
    /// Username and password (or a personal access token as password).
    Basic { username: String, password: String },
    /// An OAuth2 refresh ("identity") token.
    IdentityToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Anonymous => f.write_str("Anonymous"),
            Credential::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credential::IdentityToken(_) => f.write_str("IdentityToken(<redacted>)"),
        }
    }
}

impl Credential {
    /// `Basic <base64(user:pass)>` for Basic credentials.
    pub fn basic_header(&self) -> Option<String> {
        match self {
            Credential::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            _ => None,
        }
    }
}

/// Keys under which docker's config.json may store credentials for `host`.
pub fn credential_keys(host: &str) -> Vec<String> {
    let mut keys = vec![
        host.to_string(),
        format!("https://{host}"),
        format!("http://{host}"),
    ];
    if matches!(
        host,
        "registry-1.docker.io" | "docker.io" | "index.docker.io"
    ) {
        keys.insert(0, "https://index.docker.io/v1/".to_string());
        keys.push("docker.io".to_string());
        keys.push("index.docker.io".to_string());
    }
    keys
}

/// Where credentials come from.
#[derive(Clone, Debug)]
pub enum CredentialSource {
    /// Never send credentials.
    None,
    /// docker's config.json in this directory, or `$DOCKER_CONFIG`/`~/.docker` when `None`.
    DockerConfig(Option<PathBuf>),
    /// Fixed credentials per host (tests, embedding).
    Static(HashMap<String, Credential>),
}

impl CredentialSource {
    /// Look up credentials for `host` (blocking: may run a credential helper).
    pub fn lookup(&self, host: &str) -> Result<Credential, RegistryError> {
        let dir = match self {
            CredentialSource::None => return Ok(Credential::Anonymous),
            CredentialSource::Static(m) => {
                return Ok(m.get(host).cloned().unwrap_or(Credential::Anonymous))
            }
            CredentialSource::DockerConfig(d) => d.clone(),
        };
        let dir = dir
            .or_else(|| std::env::var_os("DOCKER_CONFIG").map(PathBuf::from))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")));
        let Some(dir) = dir else {
            return Ok(Credential::Anonymous);
        };
        let path = dir.join("config.json");
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credential::Anonymous),
            Err(e) => {
                return Err(RegistryError::Credentials {
                    host: host.to_string(),
                    detail: format!("reading {}: {e}", path.display()),
                })
            }
        };
        for key in credential_keys(host) {
            match docker_credential::get_credential_from_reader(&bytes[..], &key) {
                Ok(DockerCredential::UsernamePassword(username, password)) => {
                    return Ok(Credential::Basic { username, password })
                }
                Ok(DockerCredential::IdentityToken(t)) => return Ok(Credential::IdentityToken(t)),
                Err(CredentialRetrievalError::NoCredentialConfigured) => continue,
                Err(e) => {
                    return Err(RegistryError::Credentials {
                        host: host.to_string(),
                        detail: format!("{} key {key:?}: {e:?}", path.display()),
                    })
                }
            }
        }
        Ok(Credential::Anonymous)
    }
}

/// `repository:<repo>:<actions>` scope string.
pub fn repo_scope(repo: &str, actions: &str) -> String {
    format!("repository:{repo}:{actions}")
}

/// Shortest lifetime assumed for a token (the distribution spec's default is 60 s).
const MIN_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// Tokens are dropped this long before they expire.
const TOKEN_SAFETY_MARGIN: Duration = Duration::from_secs(10);

/// Cache of bearer tokens keyed by (host, scope). Time is passed in.
#[derive(Default, Debug)]
pub struct TokenCache {
    entries: HashMap<(String, String), (String, Instant)>,
}

impl TokenCache {
    /// A valid token for (host, scope) at `now`.
    pub fn get(&self, host: &str, scope: &str, now: Instant) -> Option<&str> {
        self.entries
            .get(&(host.to_string(), scope.to_string()))
            .filter(|(_, exp)| *exp > now)
            .map(|(t, _)| t.as_str())
    }

    /// Remember a token valid for `expires_in` (at least 60 s) from `now`, minus a margin.
    pub fn insert(
        &mut self,
        host: &str,
        scope: &str,
        token: String,
        expires_in: Option<Duration>,
        now: Instant,
    ) {
        let life = expires_in
            .unwrap_or(MIN_TOKEN_LIFETIME)
            .max(MIN_TOKEN_LIFETIME);
        self.entries.insert(
            (host.to_string(), scope.to_string()),
            (token, now + (life - TOKEN_SAFETY_MARGIN)),
        );
    }

    /// Forget the token for (host, scope) (after the registry rejected it).
    pub fn invalidate(&mut self, host: &str, scope: &str) {
        self.entries.remove(&(host.to_string(), scope.to_string()));
    }
}

#[derive(serde::Deserialize)]
struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

/// Serialises token fetches for one (host, scope).
type FetchSlot = Arc<tokio::sync::Mutex<()>>;

/// Per-client auth state: credentials, known challenges, tokens.
#[derive(Debug)]
pub(crate) struct Authenticator {
    source: CredentialSource,
    creds: Mutex<HashMap<String, Credential>>,
    challenges: Mutex<HashMap<String, Challenge>>,
    tokens: Mutex<TokenCache>,
    /// One lock per (host, scope) so concurrent first requests fetch one token, while
    /// fetches for other hosts/scopes proceed independently.
    fetch_locks: Mutex<HashMap<(String, String), FetchSlot>>,
}

/// Lock a std mutex, recovering from poisoning (the data are caches).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Authenticator {
    pub(crate) fn new(source: CredentialSource) -> Self {
        Authenticator {
            source,
            creds: Mutex::default(),
            challenges: Mutex::default(),
            tokens: Mutex::default(),
            fetch_locks: Mutex::default(),
        }
    }

    async fn credential(&self, host: &str) -> Result<Credential, RegistryError> {
        if let Some(c) = lock(&self.creds).get(host) {
            return Ok(c.clone());
        }
        let source = self.source.clone();
        let h = host.to_string();
        let c = tokio::task::spawn_blocking(move || source.lookup(&h))
            .await
            .map_err(|e| RegistryError::Credentials {
                host: host.to_string(),
                detail: e.to_string(),
            })??;
        lock(&self.creds).insert(host.to_string(), c.clone());
        Ok(c)
    }

    /// Authorization header to send to `host` for `scopes`, fetching a token if the host's
    /// challenge is known; `None` before the first challenge (anonymous attempt).
    pub(crate) async fn authorize(
        &self,
        http: &reqwest::Client,
        host: &str,
        scopes: &[String],
        stats: &crate::stats::Stats,
    ) -> Result<Option<String>, RegistryError> {
        let key = scopes.join(" ");
        if let Some(t) = lock(&self.tokens).get(host, &key, Instant::now()) {
            return Ok(Some(format!("Bearer {t}")));
        }
        let challenge = lock(&self.challenges).get(host).cloned();
        match challenge {
            None => Ok(None),
            Some(Challenge::Basic { .. }) => Ok(self.credential(host).await?.basic_header()),
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let slot = lock(&self.fetch_locks)
                    .entry((host.to_string(), key.clone()))
                    .or_default()
                    .clone();
                let _g = slot.lock().await;
                if let Some(t) = lock(&self.tokens).get(host, &key, Instant::now()) {
                    return Ok(Some(format!("Bearer {t}")));
                }
                let mut all: Vec<String> = scopes.to_vec();
                if let Some(s) = scope {
                    for s in s.split(' ').filter(|s| !s.is_empty()) {
                        if !all.iter().any(|a| a == s) {
                            all.push(s.to_string());
                        }
                    }
                }
                let cred = self.credential(host).await?;
                let (token, exp) =
                    fetch_token(http, host, &realm, service.as_deref(), &all, &cred, stats).await?;
                lock(&self.tokens).insert(host, &key, token.clone(), exp, Instant::now());
                Ok(Some(format!("Bearer {token}")))
            }
        }
    }

    /// Handle a 401 to a request sent with authorization `sent`: remember the challenge and
    /// drop the token that was rejected (only that one: a concurrent request may already have
    /// cached a fresh token). Returns false when the challenge cannot be answered (unknown
    /// scheme, or Basic without credentials).
    pub(crate) async fn on_unauthorized(
        &self,
        host: &str,
        www_authenticate: Option<&str>,
        scopes: &[String],
        sent: Option<&str>,
    ) -> bool {
        let Some(ch) = www_authenticate.and_then(parse_www_authenticate) else {
            return false;
        };
        if let Challenge::Basic { .. } = ch {
            if !matches!(self.credential(host).await, Ok(Credential::Basic { .. })) {
                return false;
            }
        }
        lock(&self.challenges).insert(host.to_string(), ch);
        if let Some(rejected) = sent.and_then(|s| s.strip_prefix("Bearer ")) {
            let key = scopes.join(" ");
            let mut tokens = lock(&self.tokens);
            if tokens.get(host, &key, Instant::now()) == Some(rejected) {
                tokens.invalidate(host, &key);
            }
        }
        true
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn fetch_token(
    http: &reqwest::Client,
    host: &str,
    realm: &str,
    service: Option<&str>,
    scopes: &[String],
    cred: &Credential,
    stats: &crate::stats::Stats,
) -> Result<(String, Option<Duration>), RegistryError> {
    let err = |detail: String| RegistryError::Token {
        realm: realm.to_string(),
        host: host.to_string(),
        detail,
    };
    stats.count_token_request();
    let req = match cred {
        Credential::IdentityToken(refresh) => {
            let mut body = format!(
                "grant_type=refresh_token&client_id=weenv&refresh_token={}",
                urlencode(refresh)
            );
            if let Some(s) = service {
                body.push_str(&format!("&service={}", urlencode(s)));
            }
            body.push_str(&format!("&scope={}", urlencode(&scopes.join(" "))));
            http.post(realm)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    "application/x-www-form-urlencoded",
                )
                .body(body)
        }
        _ => {
            let mut url =
                reqwest::Url::parse(realm).map_err(|e| err(format!("bad realm URL: {e}")))?;
            {
                let mut q = url.query_pairs_mut();
                if let Some(s) = service {
                    q.append_pair("service", s);
                }
                for s in scopes {
                    q.append_pair("scope", s);
                }
            }
            let mut r = http.get(url);
            if let Some(h) = cred.basic_header() {
                r = r.header(reqwest::header::AUTHORIZATION, h);
            }
            r
        }
    };
    let resp = req.send().await.map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| err(e.to_string()))?;
    if !status.is_success() {
        return Err(err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )));
    }
    let t: TokenResponse =
        serde_json::from_slice(&body).map_err(|e| err(format!("bad token JSON: {e}")))?;
    let token = t
        .token
        .or(t.access_token)
        .ok_or_else(|| err("no token in response".into()))?;
    Ok((token, t.expires_in.map(Duration::from_secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_and_basic_challenges() {
        let c = parse_www_authenticate(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            })
        );
        let c =
            parse_www_authenticate(r#"bearer realm=http://127.0.0.1:1/token, service = "a \"q\"""#)
                .unwrap();
        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "http://127.0.0.1:1/token".into(),
                service: Some("a \"q\"".into()),
                scope: None
            }
        );
        assert_eq!(
            parse_www_authenticate(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic {
                realm: Some("Registry Realm".into())
            })
        );
        assert_eq!(
            parse_www_authenticate("Basic"),
            Some(Challenge::Basic { realm: None })
        );
        assert_eq!(
            parse_www_authenticate(r#"Bearer service="x""#),
            None,
            "no realm"
        );
        assert_eq!(parse_www_authenticate("Negotiate abc"), None);
    }

    #[test]
    fn token_cache_expiry_and_keys() {
        let mut c = TokenCache::default();
        let t0 = Instant::now();
        c.insert(
            "h:1",
            "repository:a:pull",
            "tok".into(),
            Some(Duration::from_secs(300)),
            t0,
        );
        assert_eq!(c.get("h:1", "repository:a:pull", t0), Some("tok"));
        assert_eq!(
            c.get("h:1", "repository:a:pull,push", t0),
            None,
            "scope is part of the key"
        );
        assert_eq!(
            c.get("h:2", "repository:a:pull", t0),
            None,
            "host is part of the key"
        );
        assert_eq!(
            c.get("h:1", "repository:a:pull", t0 + Duration::from_secs(289)),
            Some("tok")
        );
        assert_eq!(
            c.get("h:1", "repository:a:pull", t0 + Duration::from_secs(290)),
            None,
            "margin"
        );
        // short or missing lifetimes count as 60 s
        c.insert("h:1", "s", "t2".into(), Some(Duration::from_secs(1)), t0);
        assert_eq!(c.get("h:1", "s", t0 + Duration::from_secs(49)), Some("t2"));
        assert_eq!(c.get("h:1", "s", t0 + Duration::from_secs(50)), None);
        c.invalidate("h:1", "repository:a:pull");
        assert_eq!(c.get("h:1", "repository:a:pull", t0), None);
    }

    #[test]
    fn docker_config_credentials() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"auths":{"127.0.0.1:5001":{"auth":"YWxpY2U6c2VjcmV0"},
                "https://index.docker.io/v1/":{"auth":"Ym9iOnB3"},
                "tok.example":{"identitytoken":"refresh-me"}}}"#,
        )
        .unwrap();
        let src = CredentialSource::DockerConfig(Some(d.path().to_path_buf()));
        assert_eq!(
            src.lookup("127.0.0.1:5001").unwrap(),
            Credential::Basic {
                username: "alice".into(),
                password: "secret".into()
            }
        );
        assert_eq!(
            src.lookup("registry-1.docker.io").unwrap(),
            Credential::Basic {
                username: "bob".into(),
                password: "pw".into()
            }
        );
        assert_eq!(
            src.lookup("tok.example").unwrap(),
            Credential::IdentityToken("refresh-me".into())
        );
        assert_eq!(src.lookup("other:1").unwrap(), Credential::Anonymous);
        let none = CredentialSource::DockerConfig(Some(d.path().join("missing")));
        assert_eq!(
            none.lookup("127.0.0.1:5001").unwrap(),
            Credential::Anonymous
        );
        let c = src.lookup("127.0.0.1:5001").unwrap();
        assert_eq!(c.basic_header().unwrap(), "Basic YWxpY2U6c2VjcmV0");
        assert!(!format!("{c:?}").contains("secret"), "Debug redacts");
    }

    #[test]
    fn missing_helper_is_a_typed_error() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("config.json"),
            r#"{"credHelpers":{"h:1":"weenv-no-such-helper"}}"#,
        )
        .unwrap();
        let src = CredentialSource::DockerConfig(Some(d.path().to_path_buf()));
        assert!(matches!(
            src.lookup("h:1"),
            Err(RegistryError::Credentials { .. })
        ));
    }

    #[test]
    fn urlencoding() {
        assert_eq!(
            urlencode("repository:a/b:pull,push x"),
            "repository%3Aa%2Fb%3Apull%2Cpush%20x"
        );
    }
}
