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
use std::path::Path;
use std::sync::Arc;
use tokio::runtime::Handle;

/// Files at least this large go up as a multipart upload, in parts of this size.
const MULTIPART_CHUNK: usize = 16 << 20;

/// Positioned reads of one dataset's files, wherever they are kept.
pub trait ReadAt {
    /// The file's length in bytes.
    fn len(&self, name: &str) -> Result<u64, String>;
    /// Exactly `len` bytes from `offset`.
    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, String>;
}

/// A dataset's files in a local directory.
pub struct LocalFiles<'a>(pub &'a Path);

impl ReadAt for LocalFiles<'_> {
    fn len(&self, name: &str) -> Result<u64, String> {
        let p = self.0.join(name);
        std::fs::metadata(&p)
            .map(|m| m.len())
            .map_err(|e| format!("{}: {e}", p.display()))
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        use std::os::unix::fs::FileExt;
        let p = self.0.join(name);
        let mut b = vec![0u8; len];
        std::fs::File::open(&p)
            .and_then(|f| f.read_exact_at(&mut b, offset))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(b)
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
    pub fn open(url: &str, rt: Handle) -> Result<Self, String> {
        let rest = url.strip_prefix("s3://").ok_or(
            "--artifact-store must be empty (files under --data-dir) or s3://bucket[/prefix]",
        )?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err("--artifact-store: the URL names no bucket".into());
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
        let store = builder
            .build()
            .map_err(|e| format!("--artifact-store {url}: {e}"))?;
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
        .map_err(|e| format!("--artifact-store {url}: cannot write to the bucket: {e}"))?;
        Ok(this)
    }

    pub fn location(&self) -> &str {
        &self.location
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
    pub fn upload(&self, id: &str, name: &str, local: &Path) -> Result<(), String> {
        let key = self.key(id, name);
        let fail = |e: &dyn std::fmt::Display| format!("{}/{key}: {e}", self.location);
        let mut file = std::fs::File::open(local).map_err(|e| fail(&e))?;
        let size = file.metadata().map_err(|e| fail(&e))?.len();
        if size < MULTIPART_CHUNK as u64 {
            let mut all = Vec::with_capacity(size as usize);
            file.read_to_end(&mut all).map_err(|e| fail(&e))?;
            return self
                .block_on(self.store.put(&key, PutPayload::from(all)))
                .map(drop)
                .map_err(|e| fail(&e));
        }
        self.block_on(async {
            let upload = self.store.put_multipart(&key).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_CHUNK);
            let mut chunk = vec![0u8; MULTIPART_CHUNK];
            loop {
                let n = file
                    .read(&mut chunk)
                    .map_err(|e| object_store::Error::Generic {
                        store: "local file",
                        source: Box::new(e),
                    })?;
                if n == 0 {
                    break;
                }
                writer.wait_for_capacity(4).await?;
                writer.write(&chunk[..n]);
            }
            writer.finish().await.map(drop)
        })
        .map_err(|e| fail(&e))
    }

    /// Uploads `len` bytes of a local file from `offset` as `name` (a recording segment).
    pub fn upload_range(
        &self,
        id: &str,
        name: &str,
        local: &Path,
        offset: u64,
        len: u64,
    ) -> Result<(), String> {
        use std::io::{Seek, SeekFrom};
        let key = self.key(id, name);
        let fail = |e: &dyn std::fmt::Display| format!("{}/{key}: {e}", self.location);
        let mut file = std::fs::File::open(local).map_err(|e| fail(&e))?;
        file.seek(SeekFrom::Start(offset)).map_err(|e| fail(&e))?;
        let mut bytes = Vec::with_capacity(len as usize);
        file.take(len)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(&e))?;
        if bytes.len() as u64 != len {
            return Err(fail(&format!(
                "{} bytes at {offset}, expected {len}",
                bytes.len()
            )));
        }
        self.block_on(self.store.put(&key, PutPayload::from(bytes)))
            .map(drop)
            .map_err(|e| fail(&e))
    }

    /// Writes object `name` of dataset `id` to `local`; false when there is no such object.
    pub fn download(&self, id: &str, name: &str, local: &Path) -> Result<bool, String> {
        let key = self.key(id, name);
        let fail = |e: &dyn std::fmt::Display| format!("{}/{key}: {e}", self.location);
        let got = match self.block_on(async { self.store.get(&key).await?.bytes().await }) {
            Ok(b) => b,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(fail(&e)),
        };
        if let Some(dir) = local.parent() {
            std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
        }
        std::fs::write(local, &got).map_err(|e| fail(&e))?;
        Ok(true)
    }

    /// Copies object `from` of dataset `id` to `to`, in the store.
    pub fn copy(&self, id: &str, from: &str, to: &str) -> Result<(), String> {
        let (a, b) = (self.key(id, from), self.key(id, to));
        self.block_on(self.store.copy(&a, &b))
            .map_err(|e| format!("{}/{a} → {b}: {e}", self.location))
    }

    /// Deletes dataset `id`'s objects under `sub` (one name or a folder of names).
    pub fn delete_under(&self, id: &str, sub: &str) -> Result<(), String> {
        self.delete_prefix(&self.key(id, sub)).map(drop)
    }

    /// Deletes every object under `prefix` (and one named `prefix` itself, a folder or
    /// one name); returns how many there were.
    fn delete_prefix(&self, prefix: &ObjectPath) -> Result<usize, String> {
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
        .map_err(|e| format!("{}/{prefix}: {e}", self.location))
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
        String,
    > {
        let key = self.key(id, name);
        match self.store.get(&key).await {
            Ok(got) => {
                let size = got.meta.size;
                let stream = got.into_stream().map(|r| r.map_err(std::io::Error::other));
                Ok(Some((size, stream)))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(format!("{}/{key}: {e}", self.location)),
        }
    }

    /// Deletes every object of dataset `id`; returns how many there were.
    pub fn delete_dataset(&self, id: &str) -> Result<usize, String> {
        self.delete_prefix(&self.prefix.child("datasets").child(id))
    }

    /// Dataset `id`'s objects, for positioned reads.
    pub fn files<'a>(&'a self, id: &'a str) -> ObjectFiles<'a> {
        ObjectFiles { store: self, id }
    }
}

/// One dataset's objects, read by range.
pub struct ObjectFiles<'a> {
    store: &'a ObjectArtifacts,
    id: &'a str,
}

impl ReadAt for ObjectFiles<'_> {
    fn len(&self, name: &str) -> Result<u64, String> {
        let key = self.store.key(self.id, name);
        self.store
            .block_on(self.store.store.head(&key))
            .map(|m| m.size)
            .map_err(|e| format!("{}/{key}: {e}", self.store.location))
    }

    fn read_at(&self, name: &str, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        let key = self.store.key(self.id, name);
        let got = self
            .store
            .block_on(
                self.store
                    .store
                    .get_range(&key, offset..offset + len as u64),
            )
            .map_err(|e| format!("{}/{key}: {e}", self.store.location))?;
        if got.len() != len {
            return Err(format!(
                "{}/{key}: {} bytes at {offset}, expected {len}",
                self.store.location,
                got.len()
            ));
        }
        Ok(got.to_vec())
    }
}
