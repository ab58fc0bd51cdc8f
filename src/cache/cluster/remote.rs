//! `Remote`: the three requests the cluster tier makes, and `RedisCluster`, which makes them to a
//! Redis Cluster through the `redis` crate's cluster client (the only module that imports it).
//!
//! Owns: connections (a small pool of the client's sync cluster connections, each used by one
//! thread at a time), their timeouts, credentials and TLS, and the mapping of Redis's answers to
//! `Stored` and `RemoteError`. Every request is bounded: the connect and response timeouts, and a
//! read of at most the length the caller gives. Must never run on a request thread (the tier's own
//! threads call it, a reader waits for them at most `--cluster-timeout`), and never put a secret in
//! a log line.

use std::path::Path;
use std::time::Duration;

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};

/// A write's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// This node's value is stored.
    Written,
    /// The key already had a value (another node won), kept.
    Present,
}

/// Why a request did not get its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The node holding the key is full (maxmemory with noeviction refused the write).
    #[error("cluster node full")]
    Full,
    /// Anything else: refused, lost or timed-out connection, cluster down, a protocol error.
    #[error("{0}")]
    Failed(String),
}

/// The requests of the cluster tier, to the real cluster or a test double. A request's keys
/// (a value and its tail) share one hash slot.
pub trait Remote: Send + Sync {
    /// Up to `max` bytes of the value at each `(key, max)`, in one round trip (empty where there
    /// is none).
    fn get(&self, keys: &[(&str, usize)]) -> Result<Vec<Vec<u8>>, RemoteError>;
    /// Stores each `(key, value)`, all or none: only if none of the keys has a value (`replace`
    /// false: SET NX or MSETNX, so one writer of a block wins), or over what is there
    /// (`replace`: a damaged value; an empty value deletes its key).
    fn put(&self, values: &[(&str, &[u8])], replace: bool) -> Result<Stored, RemoteError>;
    /// The slot map: `(first slot, last slot, "host:port" of its primary)`.
    fn slots(&self) -> Result<Vec<(u16, u16, String)>, RemoteError>;
}

/// Who the tier logs in as: from `--cluster-auth FILE`, never from the command line.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// ACL user (None: the default user).
    pub user: Option<String>,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// Reads `path`: one line holding the password, or two lines, the ACL user then the
    /// password. The file must not be readable by other users.
    pub fn read(path: &Path) -> Result<Credentials, String> {
        use std::os::unix::fs::MetadataExt;
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("--cluster-auth {shown}: {e}"))?;
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "--cluster-auth {shown}: readable by others (mode {:o}); chmod 600 it",
                meta.mode() & 0o777
            ));
        }
        if meta.len() > 64 << 10 {
            return Err(format!(
                "--cluster-auth {shown}: larger than 64 KiB, not a credentials file"
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("--cluster-auth {shown}: {e}"))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        match lines[..] {
            [password] => Ok(Credentials {
                user: None,
                password: password.trim_end_matches('\r').to_owned(),
            }),
            [user, password] => Ok(Credentials {
                user: Some(user.trim().to_owned()),
                password: password.trim_end_matches('\r').to_owned(),
            }),
            _ => Err(format!(
                "--cluster-auth {shown}: expected one line (the password) or two (user, then password)"
            )),
        }
    }
}

/// Idle connections kept for reuse: one per tier thread is all that is ever in use.
const POOL: usize = 16;

/// A Redis Cluster.
pub struct RedisCluster {
    client: ClusterClient,
    idle: Mutex<Vec<ClusterConnection>>,
}

impl RedisCluster {
    /// A client of the cluster reachable at `urls` (`redis://` or `rediss://`, one or more of its
    /// nodes), with `timeout` for connecting and for each answer. Connects lazily: the first
    /// request does, on a tier thread.
    pub fn new(
        urls: &[String],
        credentials: Option<&Credentials>,
        timeout: Duration,
    ) -> Result<RedisCluster, String> {
        if urls.iter().any(|u| u.starts_with("rediss://")) {
            // rustls needs a process-wide provider; a second install (another mount in the same
            // process, in tests) finds one and is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut builder = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // A redirect (MOVED after a failover or a reshard) is followed once; a dead node is
            // not retried here: the tier backs off from it instead.
            .retries(1)
            .min_retry_wait(5)
            .max_retry_wait(20);
        if let Some(c) = credentials {
            builder = builder.password(&c.password);
            if let Some(user) = &c.user {
                builder = builder.username(user);
            }
        }
        let client = builder
            .build()
            .map_err(|e| format!("--cluster: {}", e.detail().unwrap_or("invalid address")))?;
        Ok(RedisCluster {
            client,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Runs `request` on an idle connection (a new one if none); a connection whose request
    /// failed for another reason than the server's answer is dropped, not reused.
    fn with<T>(
        &self,
        request: impl FnOnce(&mut ClusterConnection) -> redis::RedisResult<T>,
    ) -> Result<T, RemoteError> {
        let idle = self.idle.lock().pop();
        let mut conn = match idle {
            Some(c) => c,
            None => self.client.get_connection().map_err(failed)?,
        };
        let result = request(&mut conn);
        let reusable = match &result {
            Ok(_) => true,
            Err(e) => e.code().is_some() && !e.is_io_error() && !e.is_timeout(),
        };
        if reusable {
            let mut idle = self.idle.lock();
            if idle.len() < POOL {
                idle.push(conn);
            }
        }
        result.map_err(|e| {
            if e.code() == Some("OOM") {
                RemoteError::Full
            } else {
                failed(e)
            }
        })
    }
}

fn failed(e: redis::RedisError) -> RemoteError {
    // The error's text names the node and the problem, never the password.
    RemoteError::Failed(e.to_string())
}

impl Remote for RedisCluster {
    fn get(&self, keys: &[(&str, usize)]) -> Result<Vec<Vec<u8>>, RemoteError> {
        self.with(|c| {
            let mut pipe = redis::cluster::cluster_pipe();
            for &(key, max) in keys {
                pipe.cmd("GETRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(max.saturating_sub(1));
            }
            pipe.query(c)
        })
    }

    fn put(&self, values: &[(&str, &[u8])], replace: bool) -> Result<Stored, RemoteError> {
        self.with(|c| {
            let written = match (values, replace) {
                ([(key, value)], false) => redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("NX")
                    .query::<Option<String>>(c)?
                    .is_some(),
                (_, false) => redis::cmd("MSETNX").arg(values).query::<bool>(c)?,
                (_, true) => {
                    let (gone, kept): (Vec<_>, Vec<_>) =
                        values.iter().partition(|(_, v)| v.is_empty());
                    for (key, _) in gone {
                        redis::cmd("DEL").arg(key).query::<()>(c)?;
                    }
                    redis::cmd("MSET").arg(kept).query::<()>(c)?;
                    true
                }
            };
            Ok(if written {
                Stored::Written
            } else {
                Stored::Present
            })
        })
    }

    fn slots(&self) -> Result<Vec<(u16, u16, String)>, RemoteError> {
        let reply: redis::Value = self.with(|c| redis::cmd("CLUSTER").arg("SLOTS").query(c))?;
        parse_slots(&reply)
            .ok_or_else(|| RemoteError::Failed("unexpected CLUSTER SLOTS reply".into()))
    }
}

/// `CLUSTER SLOTS`'s reply: `[[first, last, [host, port, ...], replicas...], ...]`.
fn parse_slots(reply: &redis::Value) -> Option<Vec<(u16, u16, String)>> {
    use redis::Value;
    let int = |v: &Value| match v {
        Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let Some(Value::Array(primary)) = fields.get(2) else {
                return None;
            };
            let host = text(primary.first()?)?;
            let port = int(primary.get(1)?)?;
            Some((
                int(fields.first()?)?,
                int(fields.get(1)?)?,
                format!("{host}:{port}"),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn the_slot_map_is_read_from_cluster_slots() {
        let node = |host: &str, port| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7000),
                node("10.0.0.3", 7000),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply),
            Some(vec![
                (0, 5460, "10.0.0.1:7000".into()),
                (5461, 16383, "10.0.0.2:7000".into())
            ])
        );
        assert_eq!(parse_slots(&Value::Int(3)), None);
    }

    #[test]
    fn credentials_come_from_a_private_file_and_never_show() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("auth");
        std::fs::write(&path, "s3cret\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = Credentials::read(&path).expect_err("readable by others");
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let c = Credentials::read(&path).expect("one line");
        assert_eq!((c.user.as_deref(), c.password.as_str()), (None, "s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        std::fs::write(&path, "trainer\npass word\n").expect("write");
        let c = Credentials::read(&path).expect("two lines");
        assert_eq!(
            (c.user.as_deref(), c.password.as_str()),
            (Some("trainer"), "pass word")
        );
        std::fs::write(&path, "a\nb\nc\n").expect("write");
        assert!(Credentials::read(&path).is_err());
    }
}
