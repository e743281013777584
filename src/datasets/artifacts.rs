//! Where a finished dataset's files are kept (`--artifact-store`): under `--data-dir`
//! (the default: the worker's own files, served in place), or in S3-compatible object
//! storage, where every replica can serve and delete them. With object storage the
//! worker still writes into its scratch directory under `--data-dir` (parts, checkpoint,
//! partial files) and publishes each checkpoint as it is taken: the sealed Parquet part,
//! the recordings appended since the last one (a segment per file), and the checkpoint
//! itself, last. A replica taking over a job fetches them and resumes where the
//! checkpoint stands. The finished files are published before the catalog says
//! `completed`; then the checkpoint's objects and the scratch copy are removed. Readers
//! fetch whole files as streams and recordings as byte ranges.
//!
//! The object-store client is async. Its blocking calls run on the server's runtime from
//! the dataset worker's thread or an API `blocking` thread, never from an async task.

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::runtime::Handle;

/// Files at least this large go up as a multipart upload, in parts of this size.
const MULTIPART_CHUNK: usize = 16 << 20;

/// Why the artifact store could not be opened, or a dataset's kept files not be read or
/// written. Every message names the object or file and ends with the cause: they reach
/// the log, the catalog's `error` and API problems as text.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("--artifact-store must be empty (files under --data-dir) or s3://bucket[/prefix]")]
    NotS3,
    #[error("--artifact-store: the URL names no bucket")]
    NoBucket,
    #[error("--artifact-store {url}: {source}")]
    Config {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("--artifact-store {url}: cannot write to the bucket: {source}")]
    Unwritable {
        url: String,
        #[source]
        source: object_store::Error,
    },
    /// A call about one object failed; `object` is its full name (`s3://bucket/key`).
    #[error("{object}: {source}")]
    Object {
        object: String,
        #[source]
        source: object_store::Error,
    },
    /// The local file an object is uploaded from or downloaded to.
    #[error("{object}: {}: {source}", path.display())]
    Local {
        object: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{from} → {to}: {source}")]
    Copy {
        from: String,
        to: ObjectPath,
        #[source]
        source: object_store::Error,
    },
    /// A range ends early: the object (or the local file of an upload) is truncated.
    #[error("{object}: {got} bytes at {offset}, expected {len}")]
    Short {
        object: String,
        offset: u64,
        got: u64,
        len: u64,
    },
    /// A dataset's file under `--data-dir`.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A kept file whose contents do not parse.
    #[error("{name}: {source}")]
    Corrupt {
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Positioned reads of one dataset's files, wherever they are kept.
pub trait ReadAt {
    /// The file's length in bytes.
    fn len(&self, name: &str) -> Result<u64, ArtifactError>;
    /// Exactly `len` bytes from `offset`.
    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, ArtifactError>;
}

/// A dataset's files in a local directory.
pub struct LocalFiles<'a>(pub &'a Path);

impl ReadAt for LocalFiles<'_> {
    fn len(&self, name: &str) -> Result<u64, ArtifactError> {
        let path = self.0.join(name);
        match std::fs::metadata(&path) {
            Ok(m) => Ok(m.len()),
            Err(source) => Err(ArtifactError::File { path, source }),
        }
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, ArtifactError> {
        use std::os::unix::fs::FileExt;
        let path = self.0.join(name);
        let mut b = vec![0u8; len];
        match std::fs::File::open(&path).and_then(|f| f.read_exact_at(&mut b, offset)) {
            Ok(()) => Ok(b),
            Err(source) => Err(ArtifactError::File { path, source }),
        }
    }
}

/// Finished dataset files in an S3-compatible bucket.
pub struct ObjectArtifacts {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    rt: Handle,
    location: String,
}

impl ObjectArtifacts {
    /// `s3://bucket[/prefix]`; the endpoint, region and credentials come from the usual
    /// AWS variables (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); an `http://` endpoint is allowed.
    /// Checks at once that the bucket takes a write and a delete.
    pub fn open(url: &str, rt: Handle) -> Result<Self, ArtifactError> {
        let rest = url.strip_prefix("s3://").ok_or(ArtifactError::NotS3)?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ArtifactError::NoBucket);
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .ok();
        if let Some(endpoint) = endpoint {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        let store = builder.build().map_err(|source| ArtifactError::Config {
            url: url.into(),
            source,
        })?;
        let this = Self {
            store: Arc::new(store),
            prefix: ObjectPath::from(prefix.trim_matches('/')),
            rt,
            location: format!("s3://{bucket}/{}", prefix.trim_matches('/')),
        };
        let probe = this.prefix.child(".gpu-ops-probe");
        this.block_on(async {
            this.store
                .put(&probe, PutPayload::from_static(b"probe"))
                .await?;
            this.store.delete(&probe).await
        })
        .map_err(|source| ArtifactError::Unwritable {
            url: url.into(),
            source,
        })?;
        Ok(this)
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    /// A failed call about the object at `key`.
    fn object_error(&self, key: &ObjectPath, source: object_store::Error) -> ArtifactError {
        ArtifactError::Object {
            object: format!("{}/{key}", self.location),
            source,
        }
    }

    /// A failed read or write of `local`, the object at `key`'s copy on disk.
    fn local_error(&self, key: &ObjectPath, local: &Path, source: std::io::Error) -> ArtifactError {
        ArtifactError::Local {
            object: format!("{}/{key}", self.location),
            path: local.to_path_buf(),
            source,
        }
    }

    /// `name` may have folders (`a/b`): each is a path segment (a `/` inside one
    /// segment would be escaped, and listing by the folder would not find it).
    fn key(&self, id: &str, name: &str) -> ObjectPath {
        name.split('/')
            .fold(self.prefix.child("datasets").child(id), |p, part| {
                p.child(part)
            })
    }

    /// Runs `f` to completion on the server's runtime, from a thread outside it.
    fn block_on<T>(&self, f: impl std::future::Future<Output = T> + Send) -> T
    where
        T: Send,
    {
        // A scoped plain thread: callable from any thread, even one inside the runtime.
        std::thread::scope(|s| {
            s.spawn(|| self.rt.block_on(f))
                .join()
                .expect("the object-store call panicked")
        })
    }

    /// Uploads the local file as `name` of dataset `id` (multipart when large); the
    /// object appears whole or not at all.
    pub fn upload(&self, id: &str, name: &str, local: &Path) -> Result<(), ArtifactError> {
        let key = self.key(id, name);
        let remote = |e| self.object_error(&key, e);
        let io = |e| self.local_error(&key, local, e);
        let mut file = std::fs::File::open(local).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        if size < MULTIPART_CHUNK as u64 {
            let mut all = Vec::with_capacity(size as usize);
            file.read_to_end(&mut all).map_err(io)?;
            return self
                .block_on(self.store.put(&key, PutPayload::from(all)))
                .map(drop)
                .map_err(remote);
        }
        self.block_on(async {
            let upload = self.store.put_multipart(&key).await.map_err(remote)?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_CHUNK);
            let mut chunk = vec![0u8; MULTIPART_CHUNK];
            loop {
                let n = file.read(&mut chunk).map_err(io)?;
                if n == 0 {
                    break;
                }
                writer.wait_for_capacity(4).await.map_err(remote)?;
                writer.write(&chunk[..n]);
            }
            writer.finish().await.map(drop).map_err(remote)
        })
    }

    /// Uploads `len` bytes of a local file from `offset` as `name` (a recording segment).
    pub fn upload_range(
        &self,
        id: &str,
        name: &str,
        local: &Path,
        offset: u64,
        len: u64,
    ) -> Result<(), ArtifactError> {
        use std::io::{Seek, SeekFrom};
        let key = self.key(id, name);
        let io = |e| self.local_error(&key, local, e);
        let mut file = std::fs::File::open(local).map_err(io)?;
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut bytes).map_err(io)?;
        if bytes.len() as u64 != len {
            return Err(ArtifactError::Short {
                object: format!("{}/{key}", self.location),
                offset,
                got: bytes.len() as u64,
                len,
            });
        }
        self.block_on(self.store.put(&key, PutPayload::from(bytes)))
            .map(drop)
            .map_err(|e| self.object_error(&key, e))
    }

    /// Writes object `name` of dataset `id` to `local`; false when there is no such object.
    pub fn download(&self, id: &str, name: &str, local: &Path) -> Result<bool, ArtifactError> {
        let key = self.key(id, name);
        let io = |e| self.local_error(&key, local, e);
        let got = match self.block_on(async { self.store.get(&key).await?.bytes().await }) {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.object_error(&key, e)),
        };
        if let Some(dir) = local.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(local, &got).map_err(io)?;
        Ok(true)
    }

    /// Copies object `from` of dataset `id` to `to`, in the store.
    pub fn copy(&self, id: &str, from: &str, to: &str) -> Result<(), ArtifactError> {
        let (a, b) = (self.key(id, from), self.key(id, to));
        self.block_on(self.store.copy(&a, &b))
            .map_err(|source| ArtifactError::Copy {
                from: format!("{}/{a}", self.location),
                to: b,
                source,
            })
    }

    /// Deletes dataset `id`'s objects under `sub` (one name or a folder of names).
    pub fn delete_under(&self, id: &str, sub: &str) -> Result<(), ArtifactError> {
        self.delete_prefix(&self.key(id, sub)).map(drop)
    }

    /// Deletes every object under `prefix` (and one named `prefix` itself, a folder or
    /// one name); returns how many there were.
    fn delete_prefix(&self, prefix: &ObjectPath) -> Result<usize, ArtifactError> {
        self.block_on(async {
            let keys: Vec<ObjectPath> = self
                .store
                .list(Some(prefix))
                .map(|m| m.map(|m| m.location))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<_, _>>()?;
            for k in keys.iter().chain([prefix]) {
                match self.store.delete(k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(keys.len())
        })
        .map_err(|e| self.object_error(prefix, e))
    }

    /// The object's bytes as a stream, with its length; `None` when it does not exist.
    pub async fn stream(
        &self,
        id: &str,
        name: &str,
    ) -> Result<
        Option<(
            u64,
            impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
        )>,
        ArtifactError,
    > {
        let key = self.key(id, name);
        match self.store.get(&key).await {
            Ok(got) => {
                let size = got.meta.size;
                let stream = got.into_stream().map(|r| r.map_err(std::io::Error::other));
                Ok(Some((size, stream)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.object_error(&key, e)),
        }
    }

    /// Deletes every object of dataset `id`; returns how many there were.
    pub fn delete_dataset(&self, id: &str) -> Result<usize, ArtifactError> {
        self.delete_prefix(&self.prefix.child("datasets").child(id))
    }

    /// Dataset `id`'s objects, for positioned reads.
    pub fn files<'a>(&'a self, id: &'a str) -> ObjectFiles<'a> {
        ObjectFiles { store: self, id }
    }
}

/// Resident arrays' values (`arrays::shared`): one object each, `arrays/<id>.bin`, put
/// whole (an array is at most `--max-tenant-array-mib`), read whole.
impl ObjectArtifacts {
    fn array_key(&self, id: &str) -> ObjectPath {
        self.prefix.child("arrays").child(format!("{id}.bin"))
    }

    pub fn put_array(&self, id: &str, values: Bytes) -> Result<(), ArtifactError> {
        let key = self.array_key(id);
        self.block_on(self.store.put(&key, PutPayload::from(values)))
            .map(drop)
            .map_err(|e| self.object_error(&key, e))
    }

    /// The array's values; `None` when there is no such object.
    pub fn get_array(&self, id: &str) -> Result<Option<Bytes>, ArtifactError> {
        let key = self.array_key(id);
        match self.block_on(async { self.store.get(&key).await?.bytes().await }) {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.object_error(&key, e)),
        }
    }

    /// Deletes the array's object (none is not an error).
    pub fn delete_array(&self, id: &str) -> Result<(), ArtifactError> {
        let key = self.array_key(id);
        match self.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.object_error(&key, e)),
        }
    }
}

/// One dataset's objects, read by range.
pub struct ObjectFiles<'a> {
    store: &'a ObjectArtifacts,
    id: &'a str,
}

impl ReadAt for ObjectFiles<'_> {
    fn len(&self, name: &str) -> Result<u64, ArtifactError> {
        let key = self.store.key(self.id, name);
        self.store
            .block_on(self.store.store.head(&key))
            .map(|m| m.size)
            .map_err(|e| self.store.object_error(&key, e))
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, ArtifactError> {
        let key = self.store.key(self.id, name);
        let got = self
            .store
            .block_on(
                self.store
                    .store
                    .get_range(&key, offset..offset + len as u64),
            )
            .map_err(|e| self.store.object_error(&key, e))?;
        if got.len() != len {
            return Err(ArtifactError::Short {
                object: format!("{}/{key}", self.store.location),
                offset,
                got: got.len() as u64,
                len: len as u64,
            });
        }
        Ok(got.to_vec())
    }
}
