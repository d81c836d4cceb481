//! The incremental machinery: digests memoised per object version ([`Memo`]), a small
//! scoped-thread pool for independent work ([`parallel_map`], [`join`]), and the content
//! sum kept up to date one changed resource at a time ([`Summed`], `update_sum`).

use std::sync::Arc;

use holdfast_proto::content;
use holdfast_proto::content::ContentSum;
use holdfast_proto::v1::{Certificate, DefaultBackend, ResourceKind};

use super::resolve::TlsOut;
use super::{Changed, FastMap, FastSet, Translator};

/// The address of an `Arc`'s value: the identity of a digest or cached object.
pub(super) fn addr<T>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a) as usize
}

/// Digests of one kind, keyed by the address of the cached object's `Arc`. The reflector
/// stores replace an object's `Arc` whenever it changes and hand out clones of the same
/// `Arc` otherwise, so an unchanged object is digested once. Each entry keeps its `Arc`
/// alive, so an address cannot be reused by another object while it is a key here.
pub(super) struct Memo<K, D> {
    pub(super) entries: FastMap<usize, (Arc<K>, Arc<D>, u64)>,
}

impl<K, D> Default for Memo<K, D> {
    fn default() -> Self {
        Memo {
            entries: FastMap::default(),
        }
    }
}

/// What changed in one kind since the last build: a modified object is a removal of its
/// old digest and an addition of its new one.
pub(super) struct Changes<D> {
    pub(super) added: Vec<Arc<D>>,
    pub(super) removed: Vec<Arc<D>>,
}

impl<K: Sync + Send, D: Send + Sync> Memo<K, D> {
    /// Digests what is new in `objects`, forgets what is gone, and says which is which.
    pub(super) fn refresh(
        &mut self,
        objects: &[Arc<K>],
        generation: u64,
        digest: impl Fn(&K) -> D + Sync,
    ) -> Changes<D> {
        let mut missing: Vec<&Arc<K>> = Vec::new();
        for object in objects {
            match self.entries.get_mut(&addr(object)) {
                Some(entry) => entry.2 = generation,
                None => missing.push(object),
            }
        }
        let added = parallel_map(&missing, |o| Arc::new(digest(o.as_ref())));
        for (object, d) in missing.into_iter().zip(&added) {
            self.entries
                .insert(addr(object), (object.clone(), d.clone(), generation));
        }
        let mut removed = Vec::new();
        if self.entries.len() > objects.len() {
            self.entries.retain(|_, e| {
                let keep = e.2 == generation;
                if !keep {
                    removed.push(e.1.clone());
                }
                keep
            });
        }
        Changes { added, removed }
    }

    /// Every current digest.
    pub(super) fn digests(&self) -> impl Iterator<Item = &Arc<D>> {
        self.entries.values().map(|e| &e.1)
    }
}

/// How many threads a build uses (the machine's parallelism, at most 4).
pub(super) fn threads() -> usize {
    // Asked once: `available_parallelism` reads the affinity mask and cgroup quota.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
}

/// `items.iter().map(f)`, in order, on up to [`threads`] threads when there are enough
/// items to be worth it.
pub(super) fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = threads();
    if threads < 2 || items.len() < 512 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let mut chunks = items.chunks(chunk);
        let first = chunks.next().unwrap_or(&[]);
        let handles: Vec<_> = chunks
            .map(|c| scope.spawn(move || c.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut out: Vec<R> = Vec::with_capacity(items.len());
        out.extend(first.iter().map(f));
        for h in handles {
            out.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        out
    })
}

/// Runs `a` and `b`, on two threads when the machine has them and `big` says the work is
/// worth a thread.
pub(super) fn join<A: Send, B: Send>(
    big: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !big || threads() < 2 {
        return (a(), b());
    }
    std::thread::scope(|scope| {
        let hb = scope.spawn(b);
        let ra = a();
        (
            ra,
            hb.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
        )
    })
}

/// The content sum of the last build and the resource hash each resource had in it
/// (`holdfast_proto::content`): a build hashes only the resources that changed.
#[derive(Default)]
pub(super) struct Summed {
    pub(super) sum: ContentSum,
    /// Each resource's hash and the length of its encoding in a snapshot.
    pub(super) hosts: FastMap<String, ([u8; 32], usize)>,
    pub(super) backends: FastMap<String, ([u8; 32], usize)>,
    pub(super) gateway_listeners: FastMap<String, ([u8; 32], usize)>,
    pub(super) gateway_hosts: FastMap<String, ([u8; 32], usize)>,
    /// The encoded length of the snapshot's repeated resources.
    pub(super) resources_len: usize,
    pub(super) certificates: FastMap<String, (Certificate, [u8; 32])>,
    pub(super) default_backend: Option<[u8; 32]>,
    pub(super) default_certificate: Option<[u8; 32]>,
}

impl Summed {
    /// Sets the hash of resource `name` in `map` (and in the sum) to `new`; true if it
    /// changed.
    pub(super) fn set(
        sum: &mut ContentSum,
        resources_len: &mut usize,
        map: &mut FastMap<String, ([u8; 32], usize)>,
        name: &str,
        new: Option<([u8; 32], usize)>,
    ) -> bool {
        let old = match new {
            Some(h) => map.insert(name.to_owned(), h),
            None => map.remove(name),
        };
        sum.replace(old.as_ref().map(|o| &o.0), new.as_ref().map(|n| &n.0));
        *resources_len = *resources_len + new.map_or(0, |n| n.1) - old.map_or(0, |o| o.1);
        old.map(|o| o.0) != new.map(|n| n.0)
    }
}

/// Field numbers of `Snapshot`'s repeated resources.
pub(super) const VIRTUAL_HOSTS_TAG: u32 = 5;

pub(super) const BACKENDS_TAG: u32 = 6;

pub(super) const CERTIFICATES_TAG: u32 = 8;

pub(super) const GATEWAY_LISTENERS_TAG: u32 = 11;

pub(super) const GATEWAY_HOSTS_TAG: u32 = 12;

/// The length of `message` encoded as field `tag` of a snapshot.
pub(super) fn encoded_len(tag: u32, message: &impl prost::Message) -> usize {
    prost::encoding::message::encoded_len(tag, message)
}

/// The resource hash of `message`, of kind `kind`.
pub(super) fn hash_of(kind: ResourceKind, message: &impl prost::Message) -> [u8; 32] {
    content::resource_hash(kind, &message.encode_to_vec())
}

impl Translator {
    /// Brings the content sum up to date with the hosts and backends changed since the
    /// last build and this build's default backend and certificates, and returns the
    /// content hash. Hashes only what changed (the certificates are compared first).
    pub(super) fn update_sum(
        &mut self,
        default_backend: Option<&DefaultBackend>,
        tls: &TlsOut,
    ) -> (String, Changed) {
        let mut changed = Changed::default();
        let mut hosts = std::mem::take(&mut self.unsummed_hosts);
        hosts.sort_unstable();
        hosts.dedup();
        let mut backends = std::mem::take(&mut self.backends.unsummed);
        backends.sort_unstable();
        backends.dedup();
        let (host_map, backend_map) = (&self.hosts, &self.backends.entries);
        let (host_hashes, backend_hashes) = join(
            hosts.len() + backends.len() > 2_000,
            || {
                parallel_map(&hosts, |h| {
                    host_map.get(h).map(|e| {
                        (
                            hash_of(ResourceKind::GatewayHost, &*e.wire),
                            encoded_len(GATEWAY_HOSTS_TAG, &*e.wire),
                        )
                    })
                })
            },
            || {
                parallel_map(&backends, |b| {
                    backend_map.get(b).map(|e| {
                        (
                            hash_of(ResourceKind::Backend, &*e.backend),
                            encoded_len(BACKENDS_TAG, &*e.backend),
                        )
                    })
                })
            },
        );
        let s = &mut self.sum;
        for (name, new) in hosts.into_iter().zip(host_hashes) {
            if Summed::set(&mut s.sum, &mut s.resources_len, &mut s.hosts, &name, new) {
                // Sent as the Gateway host of listener `ingress`.
                changed
                    .gateway_hosts
                    .push(holdfast_proto::snapshot::gateway_host_name(
                        holdfast_proto::snapshot::INGRESS_LISTENER,
                        &name,
                    ));
            }
        }
        for (name, new) in backends.into_iter().zip(backend_hashes) {
            if Summed::set(
                &mut s.sum,
                &mut s.resources_len,
                &mut s.backends,
                &name,
                new,
            ) {
                changed.backends.push(name);
            }
        }
        let mut listeners = std::mem::take(&mut self.gateway.unsummed_listeners);
        listeners.sort_unstable();
        listeners.dedup();
        for name in listeners {
            let new = self.gateway.listeners.get(&name).map(|l| {
                (
                    hash_of(ResourceKind::GatewayListener, &**l),
                    encoded_len(GATEWAY_LISTENERS_TAG, &**l),
                )
            });
            if Summed::set(
                &mut s.sum,
                &mut s.resources_len,
                &mut s.gateway_listeners,
                &name,
                new,
            ) {
                changed.gateway_listeners.push(name);
            }
        }
        let mut gateway_hosts = std::mem::take(&mut self.gateway.unsummed_hosts);
        gateway_hosts.sort_unstable();
        gateway_hosts.dedup();
        for name in gateway_hosts {
            let new = self.gateway.hosts.get(&name).map(|e| {
                (
                    hash_of(ResourceKind::GatewayHost, &*e.host),
                    encoded_len(GATEWAY_HOSTS_TAG, &*e.host),
                )
            });
            if Summed::set(
                &mut s.sum,
                &mut s.resources_len,
                &mut s.gateway_hosts,
                &name,
                new,
            ) {
                changed.gateway_hosts.push(name);
            }
        }
        changed.gateway_hosts.sort_unstable();
        let current: FastSet<&str> = tls.certificates.iter().map(|c| c.name.as_str()).collect();
        let gone: Vec<String> = s
            .certificates
            .keys()
            .filter(|name| !current.contains(name.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some((c, h)) = s.certificates.remove(&name) {
                s.sum.remove(&h);
                s.resources_len -= encoded_len(CERTIFICATES_TAG, &c);
                changed.certificates.push(name);
            }
        }
        for c in &tls.certificates {
            if s.certificates
                .get(&c.name)
                .is_some_and(|(held, _)| held == c)
            {
                continue;
            }
            let h = hash_of(ResourceKind::Certificate, c);
            let old = s.certificates.insert(c.name.clone(), (c.clone(), h));
            s.resources_len += encoded_len(CERTIFICATES_TAG, c);
            if let Some((o, _)) = &old {
                s.resources_len -= encoded_len(CERTIFICATES_TAG, o);
            }
            if old.as_ref().map(|(_, h)| h) != Some(&h) {
                changed.certificates.push(c.name.clone());
            }
            s.sum.replace(old.as_ref().map(|(_, h)| h), Some(&h));
        }
        changed.certificates.sort_unstable();
        let new = default_backend.map(|d| hash_of(ResourceKind::DefaultBackend, d));
        changed.default_backend = s.default_backend != new;
        s.sum.replace(s.default_backend.as_ref(), new.as_ref());
        s.default_backend = new;
        let new = (!tls.default_certificate.is_empty()).then(|| {
            content::resource_hash(
                ResourceKind::DefaultCertificate,
                tls.default_certificate.as_bytes(),
            )
        });
        changed.default_certificate = s.default_certificate != new;
        s.sum.replace(s.default_certificate.as_ref(), new.as_ref());
        s.default_certificate = new;
        (s.sum.content_hash(), changed)
    }
}
