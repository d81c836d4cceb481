//! The snapshot a proxy holds, kept so that a delta is checked and applied in O(change).
//!
//! [`Held`] keeps each resource by name behind an `Arc`, the resources' hashes and their
//! sum ([`Hashed`]), and who refers to what: for each backend the hosts with a route to
//! it, for each certificate the hosts that serve it. [`Held::check`] decides, without
//! changing anything, whether a delta makes a snapshot a proxy may serve: the base is the
//! one held, every removal names a resource held, no name is given twice, each upserted
//! host is well formed, every reference resolves after the change (a removed backend must
//! have lost all its routes), and the stated content hash and version are those of the
//! result. Each of these looks only at the delta's resources and at the references to
//! them, so it costs O(change), where rebuilding and re-validating the snapshot cost
//! O(snapshot). [`Held::commit`] then takes the delta in.
//!
//! Each resource is held as its protobuf encoding ([`Encoded`]), about a tenth of the
//! memory of the decoded message, and decoded only when a delta touches it or the whole
//! snapshot is written out: a proxy keeps the compiled route table for serving, and this
//! only to check and apply the next delta.
//!
//! A name is held once: the maps' keys are `Arc<str>`, which the who-uses-what pairs
//! share, and [`SharedNames`] lets the data plane's route table share them too (the
//! table takes the names held already; a delta's new names come from the table).
//!
//! The result is exactly what [`super::apply`] accepts and makes; the property test
//! `held_accepts_and_makes_what_apply_does` holds the two together.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::marker::PhantomData;
use std::ops::Bound;
use std::sync::Arc;

use prost::Message;

use super::{HashEdit, Hashed, InvalidDelta, Inventory, hash_edit};
use crate::snapshot::{self, InvalidSnapshot};
use crate::v1::{
    Backend, Certificate, DefaultBackend, GatewayHost, GatewayListener, KindProgress, ResourceKind,
    Snapshot, SnapshotDelta, VirtualHost,
};

/// Field numbers of `Snapshot`'s repeated resources (for its encoded length).
const VIRTUAL_HOSTS_TAG: u32 = 5;
const BACKENDS_TAG: u32 = 6;
const CERTIFICATES_TAG: u32 = 8;
const GATEWAY_LISTENERS_TAG: u32 = 11;
const GATEWAY_HOSTS_TAG: u32 = 12;

/// One kind of resource held, by name. A name is held once: the [`Uses`] pairs share the
/// map's key (a host's routes name its backend by the backend's key).
type ByName<T> = BTreeMap<Arc<str>, Encoded<T>>;

/// Names of resources held somewhere else already, to hold rather than a copy: the data
/// plane's route table and [`Held`] give each other theirs, so that a host's or a
/// backend's name is one allocation for both.
pub trait SharedNames {
    /// The copy of `name`, a resource of `kind`, held here, if any.
    fn shared(&self, kind: ResourceKind, name: &str) -> Option<Arc<str>>;
}

/// No names held elsewhere.
impl SharedNames for () {
    fn shared(&self, _: ResourceKind, _: &str) -> Option<Arc<str>> {
        None
    }
}

/// The names of the resources held (the keys of its maps).
impl SharedNames for Held {
    fn shared(&self, kind: ResourceKind, name: &str) -> Option<Arc<str>> {
        match kind {
            ResourceKind::VirtualHost => key_of(&self.virtual_hosts, name),
            ResourceKind::Backend => key_of(&self.backends, name),
            ResourceKind::Certificate => key_of(&self.certificates, name),
            ResourceKind::GatewayListener => key_of(&self.gateway_listeners, name),
            ResourceKind::GatewayHost => key_of(&self.gateway_hosts, name),
            _ => None,
        }
    }
}

/// `held`'s key for `name`, if it holds one.
fn key_of<T>(held: &BTreeMap<Arc<str>, T>, name: &str) -> Option<Arc<str>> {
    held.get_key_value(name).map(|(key, _)| key.clone())
}

/// A verified snapshot, held by resource.
#[derive(Debug, Clone, Default)]
pub struct Held {
    version: String,
    content_hash: String,
    cluster_revision: u64,
    progress: Vec<KindProgress>,
    virtual_hosts: ByName<VirtualHost>,
    backends: ByName<Backend>,
    certificates: ByName<Certificate>,
    default_backend: Option<Arc<DefaultBackend>>,
    default_certificate: String,
    gateway_listeners: ByName<GatewayListener>,
    gateway_hosts: ByName<GatewayHost>,
    hashed: Hashed,
    /// Backend name → the virtual hosts and Gateway hosts with a route to it (a Gateway
    /// host's name has a space, a virtual host's never does).
    backend_users: Uses,
    /// Certificate name → the virtual hosts, Ingress hosts given as Gateway hosts
    /// (`ingress <host>`) and Gateway listeners that serve it (a listener's name has a
    /// `:`, a host's never does).
    certificate_users: Uses,
    /// Gateway listener name → its Gateway hosts.
    listener_hosts: Uses,
    /// The encoded length of the repeated resources.
    resources_len: usize,
}

/// A resource held as its protobuf encoding, decoded when it is needed.
#[derive(Debug, Clone)]
struct Encoded<T> {
    bytes: Box<[u8]>,
    kind: PhantomData<fn() -> T>,
}

impl<T: Message + Default> Encoded<T> {
    fn new(message: &T) -> Self {
        Encoded {
            bytes: message.encode_to_vec().into_boxed_slice(),
            kind: PhantomData,
        }
    }

    /// The message. These bytes are `T`'s own encoding, made by [`Encoded::new`] from a
    /// message of that type, so decoding them cannot fail.
    fn decode(&self) -> T {
        T::decode(&*self.bytes).expect("the bytes are a T's own encoding")
    }

    /// The length of this message's encoding as field `tag` of its parent.
    fn field_len(&self, tag: u32) -> usize {
        let len = self.bytes.len();
        prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(len as u64) + len
    }
}

/// What [`Held::check`] worked out for [`Held::commit`].
#[derive(Debug)]
pub struct Checked {
    edit: HashEdit,
    encoded_len: usize,
}

impl Checked {
    /// The length of the encoding of the snapshot the delta makes.
    pub fn encoded_len(&self) -> usize {
        self.encoded_len
    }
}

impl Held {
    /// Holds `snapshot`, whose hashes are `hashed` (from [`Hashed::verified`] or
    /// [`Hashed::of`]).
    pub fn new(snapshot: Snapshot, hashed: Hashed) -> Self {
        Held::sharing(snapshot, hashed, &())
    }

    /// [`Held::new`], holding the names `names` has rather than copies.
    pub fn sharing(snapshot: Snapshot, hashed: Hashed, names: &dyn SharedNames) -> Self {
        let mut held = Held {
            version: snapshot.version,
            content_hash: snapshot.content_hash,
            cluster_revision: snapshot.cluster_revision,
            progress: snapshot.progress,
            default_backend: snapshot.default_backend.map(Arc::new),
            default_certificate: snapshot.default_certificate,
            hashed,
            ..Held::default()
        };
        for b in &snapshot.backends {
            held.insert_backend(b, names);
        }
        for c in &snapshot.certificates {
            held.insert_certificate(c, names);
        }
        for v in &snapshot.virtual_hosts {
            held.insert_host(v, names);
        }
        for l in &snapshot.gateway_listeners {
            held.insert_listener(l, names);
        }
        for g in &snapshot.gateway_hosts {
            held.insert_gateway_host(g, names);
        }
        held
    }

    /// The Gateway listeners (each decoded).
    pub fn gateway_listeners(&self) -> impl Iterator<Item = GatewayListener> {
        self.gateway_listeners.values().map(Encoded::decode)
    }

    /// The Gateway listener named `name` (decoded).
    pub fn gateway_listener(&self, name: &str) -> Option<GatewayListener> {
        self.gateway_listeners.get(name).map(Encoded::decode)
    }

    /// The Gateway host named `name` (decoded).
    pub fn gateway_host(&self, name: &str) -> Option<GatewayHost> {
        self.gateway_hosts.get(name).map(Encoded::decode)
    }

    /// The Gateway hosts of listener `name` (each decoded).
    pub fn hosts_of_listener<'a>(
        &'a self,
        name: &str,
    ) -> impl Iterator<Item = GatewayHost> + use<'a> {
        self.listener_hosts
            .of(name)
            .filter_map(|h| self.gateway_hosts.get(h))
            .map(Encoded::decode)
    }

    /// The Gateway hosts (each decoded).
    pub fn gateway_hosts(&self) -> impl Iterator<Item = GatewayHost> {
        self.gateway_hosts.values().map(Encoded::decode)
    }

    /// The version held.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The cluster revision held.
    pub fn cluster_revision(&self) -> u64 {
        self.cluster_revision
    }

    /// The progress per kind held.
    pub fn progress(&self) -> &[KindProgress] {
        &self.progress
    }

    /// Each resource's hash.
    pub fn inventory(&self) -> &Inventory {
        self.hashed.inventory()
    }

    /// The length of the held snapshot's encoding.
    pub fn encoded_len(&self) -> usize {
        self.identity().encoded_len() + self.resources_len
    }

    /// The virtual host for `host` (decoded).
    pub fn virtual_host(&self, host: &str) -> Option<VirtualHost> {
        self.virtual_hosts.get(host).map(Encoded::decode)
    }

    /// The backend named `name` (decoded).
    pub fn backend(&self, name: &str) -> Option<Backend> {
        self.backends.get(name).map(Encoded::decode)
    }

    /// The certificate named `name` (decoded).
    pub fn certificate(&self, name: &str) -> Option<Certificate> {
        self.certificates.get(name).map(Encoded::decode)
    }

    /// The default backend.
    pub fn default_backend(&self) -> Option<&Arc<DefaultBackend>> {
        self.default_backend.as_ref()
    }

    /// The hosts with a route to backend `name`.
    pub fn hosts_using_backend<'a>(
        &'a self,
        name: &str,
    ) -> impl Iterator<Item = &'a str> + use<'a> {
        self.backend_users.of(name)
    }

    /// The hosts that serve certificate `name`.
    pub fn hosts_using_certificate<'a>(
        &'a self,
        name: &str,
    ) -> impl Iterator<Item = &'a str> + use<'a> {
        self.certificate_users.of(name)
    }

    /// The snapshot held, whole (O(snapshot): for writing it, not per delta).
    pub fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            virtual_hosts: self.virtual_hosts.values().map(Encoded::decode).collect(),
            backends: self.backends.values().map(Encoded::decode).collect(),
            certificates: self.certificates.values().map(Encoded::decode).collect(),
            gateway_listeners: self.gateway_listeners().collect(),
            gateway_hosts: self.gateway_hosts().collect(),
            ..self.identity()
        }
    }

    /// The snapshot's fields other than its repeated resources.
    fn identity(&self) -> Snapshot {
        Snapshot {
            version: self.version.clone(),
            content_hash: self.content_hash.clone(),
            cluster_revision: self.cluster_revision,
            progress: self.progress.clone(),
            created_at: None,
            default_backend: self.default_backend.as_deref().cloned(),
            default_certificate: self.default_certificate.clone(),
            ..Snapshot::default()
        }
    }

    /// Whether `delta` applies to what is held and makes a snapshot that a complete one
    /// with its identity would be accepted as (see the module documentation). Changes
    /// nothing.
    pub fn check(&self, delta: &SnapshotDelta) -> Result<Checked, InvalidDelta> {
        if delta.base_version != self.version {
            return Err(InvalidDelta::UnknownBase {
                wanted: delta.base_version.clone(),
                held: self.version.clone(),
            });
        }
        let hosts = names(
            "virtual host",
            &self.virtual_hosts,
            &delta.upserted_virtual_hosts,
            &delta.removed_virtual_hosts,
            |v| &v.host,
        )?;
        let backends = names(
            "backend",
            &self.backends,
            &delta.upserted_backends,
            &delta.removed_backends,
            |b| &b.name,
        )?;
        let certificates = names(
            "certificate",
            &self.certificates,
            &delta.upserted_certificates,
            &delta.removed_certificates,
            |c| &c.name,
        )?;
        let gateway_hosts = names(
            "gateway host",
            &self.gateway_hosts,
            &delta.upserted_gateway_hosts,
            &delta.removed_gateway_hosts,
            |g| &g.name,
        )?;
        let backend_after = |name: &str| backends.after(name, &self.backends);
        let certificate_after =
            |name: &str| name.is_empty() || certificates.after(name, &self.certificates);
        for vhost in &delta.upserted_virtual_hosts {
            snapshot::validate_virtual_host(vhost)?;
            // One form per Ingress host (see `snapshot::validate`).
            let as_gateway_host =
                snapshot::gateway_host_name(snapshot::INGRESS_LISTENER, &vhost.host);
            if gateway_hosts.after(&as_gateway_host, &self.gateway_hosts) {
                return Err(InvalidSnapshot::DuplicateHost(vhost.host.clone()).into());
            }
            if !certificate_after(&vhost.certificate) {
                return Err(InvalidSnapshot::MissingCertificate {
                    host: vhost.host.clone(),
                    certificate: vhost.certificate.clone(),
                }
                .into());
            }
            for route in &vhost.routes {
                if !backend_after(&route.backend) {
                    return Err(InvalidSnapshot::MissingBackend {
                        host: vhost.host.clone(),
                        path: route.path.clone(),
                        backend: route.backend.clone(),
                    }
                    .into());
                }
            }
        }
        let listeners = names(
            "gateway listener",
            &self.gateway_listeners,
            &delta.upserted_gateway_listeners,
            &delta.removed_gateway_listeners,
            |l| &l.name,
        )?;
        for l in &delta.upserted_gateway_listeners {
            snapshot::validate_gateway_listener(l)?;
            if let Some(c) = snapshot::listener_certificates(l).find(|c| !certificate_after(c)) {
                return Err(bad_gateway(
                    "listener",
                    &l.name,
                    format!("certificate {c:?} is not in the snapshot"),
                )
                .into());
            }
        }
        for g in &delta.upserted_gateway_hosts {
            snapshot::validate_gateway_host(g)?;
            if snapshot::is_ingress_host(g) {
                if hosts.after(&g.host, &self.virtual_hosts) {
                    return Err(InvalidSnapshot::DuplicateHost(g.host.clone()).into());
                }
                if !certificate_after(&g.certificate) {
                    return Err(InvalidSnapshot::MissingCertificate {
                        host: g.host.clone(),
                        certificate: g.certificate.clone(),
                    }
                    .into());
                }
            } else if !listeners.after(&g.listener, &self.gateway_listeners) {
                return Err(bad_gateway(
                    "host",
                    &g.name,
                    format!("listener {:?} is not in the snapshot", g.listener),
                )
                .into());
            }
            if let Some(b) = snapshot::gateway_host_backends(g).find(|b| !backend_after(b)) {
                return Err(bad_gateway(
                    "host",
                    &g.name,
                    format!("backend {b:?} is not in the snapshot"),
                )
                .into());
            }
        }
        for gone in &delta.removed_gateway_listeners {
            if let Some(host) = self
                .listener_hosts
                .of(gone)
                .find(|h| !gateway_hosts.touched.contains(h))
            {
                return Err(bad_gateway(
                    "host",
                    host,
                    format!("listener {gone:?} is not in the snapshot"),
                )
                .into());
            }
        }
        // A host the delta leaves alone must not lose what it names.
        let untouched = |host: &&str| {
            !hosts.touched.contains(host)
                && !gateway_hosts.touched.contains(host)
                && !listeners.touched.contains(host)
        };
        for gone in &delta.removed_backends {
            if let Some(host) = self.backend_users.of(gone).find(untouched) {
                if self.gateway_hosts.contains_key(host) {
                    return Err(bad_gateway(
                        "host",
                        host,
                        format!("backend {gone:?} is not in the snapshot"),
                    )
                    .into());
                }
                let path = self
                    .virtual_host(host)
                    .into_iter()
                    .flat_map(|v| v.routes)
                    .find(|r| &r.backend == gone)
                    .map(|r| r.path)
                    .unwrap_or_default();
                return Err(InvalidSnapshot::MissingBackend {
                    host: host.to_owned(),
                    path,
                    backend: gone.clone(),
                }
                .into());
            }
        }
        for gone in &delta.removed_certificates {
            if let Some(host) = self.certificate_users.of(gone).find(untouched) {
                if self.gateway_listeners.contains_key(host) {
                    return Err(bad_gateway(
                        "listener",
                        host,
                        format!("certificate {gone:?} is not in the snapshot"),
                    )
                    .into());
                }
                return Err(InvalidSnapshot::MissingCertificate {
                    host: snapshot::ingress_host_of(host).unwrap_or(host).to_owned(),
                    certificate: gone.clone(),
                }
                .into());
            }
        }
        let default_backend = if delta.default_backend_changed {
            delta.default_backend.as_ref()
        } else {
            self.default_backend.as_deref()
        };
        if let Some(d) = default_backend
            && !backend_after(&d.backend)
        {
            return Err(InvalidSnapshot::MissingBackend {
                host: String::new(),
                path: "(default backend)".into(),
                backend: d.backend.clone(),
            }
            .into());
        }
        let default_certificate = if delta.default_certificate_changed {
            &delta.default_certificate
        } else {
            &self.default_certificate
        };
        if !certificate_after(default_certificate) {
            return Err(InvalidSnapshot::MissingCertificate {
                host: String::new(),
                certificate: default_certificate.clone(),
            }
            .into());
        }
        let edit = hash_edit(&self.hashed, delta);
        let computed = edit.sum.content_hash();
        if computed != delta.content_hash {
            return Err(InvalidSnapshot::HashMismatch {
                stated: delta.content_hash.clone(),
                computed,
            }
            .into());
        }
        if delta.version != snapshot::version_string(delta.cluster_revision, &delta.content_hash) {
            return Err(InvalidSnapshot::BadVersion {
                version: delta.version.clone(),
                revision: delta.cluster_revision,
            }
            .into());
        }
        let encoded_len = self.encoded_len_after(delta);
        Ok(Checked { edit, encoded_len })
    }

    /// Takes in `delta`, which [`Held::check`] accepted (as `checked`) against exactly
    /// what is held. O(change).
    pub fn commit(&mut self, delta: &SnapshotDelta, checked: Checked) {
        self.commit_sharing(delta, checked, &());
    }

    /// [`Held::commit`], holding the names `names` has rather than copies (of the
    /// resources the delta upserts that are not held yet).
    pub fn commit_sharing(
        &mut self,
        delta: &SnapshotDelta,
        checked: Checked,
        names: &dyn SharedNames,
    ) {
        for host in delta
            .removed_virtual_hosts
            .iter()
            .chain(delta.upserted_virtual_hosts.iter().map(|v| &v.host))
        {
            self.remove_host(host);
        }
        for name in &delta.removed_backends {
            if let Some(old) = self.backends.remove(name.as_str()) {
                self.resources_len -= old.field_len(BACKENDS_TAG);
            }
        }
        for b in &delta.upserted_backends {
            self.insert_backend(b, names);
        }
        for name in &delta.removed_certificates {
            if let Some(old) = self.certificates.remove(name.as_str()) {
                self.resources_len -= old.field_len(CERTIFICATES_TAG);
            }
        }
        for c in &delta.upserted_certificates {
            self.insert_certificate(c, names);
        }
        // After the backends and certificates they name, so that they share their names.
        for v in &delta.upserted_virtual_hosts {
            self.insert_host(v, names);
        }
        for name in delta
            .removed_gateway_hosts
            .iter()
            .chain(delta.upserted_gateway_hosts.iter().map(|g| &g.name))
        {
            self.remove_gateway_host(name);
        }
        for name in delta
            .removed_gateway_listeners
            .iter()
            .chain(delta.upserted_gateway_listeners.iter().map(|l| &l.name))
        {
            self.remove_listener(name);
        }
        for l in &delta.upserted_gateway_listeners {
            self.insert_listener(l, names);
        }
        for g in &delta.upserted_gateway_hosts {
            self.insert_gateway_host(g, names);
        }
        if delta.default_backend_changed {
            self.default_backend = delta.default_backend.clone().map(Arc::new);
        }
        if delta.default_certificate_changed {
            self.default_certificate = delta.default_certificate.clone();
        }
        self.version = delta.version.clone();
        self.content_hash = delta.content_hash.clone();
        self.cluster_revision = delta.cluster_revision;
        self.progress.clone_from(&delta.progress);
        self.hashed.commit(checked.edit);
    }

    /// The encoded length of the snapshot `delta` (checked) makes.
    fn encoded_len_after(&self, delta: &SnapshotDelta) -> usize {
        use prost::encoding::message::encoded_len;
        let mut len = self.resources_len;
        let hosts = delta
            .removed_virtual_hosts
            .iter()
            .chain(delta.upserted_virtual_hosts.iter().map(|v| &v.host));
        len -= hosts
            .filter_map(|h| self.virtual_hosts.get(h.as_str()))
            .map(|v| v.field_len(VIRTUAL_HOSTS_TAG))
            .sum::<usize>();
        let backends = delta
            .removed_backends
            .iter()
            .chain(delta.upserted_backends.iter().map(|b| &b.name));
        len -= backends
            .filter_map(|b| self.backends.get(b.as_str()))
            .map(|b| b.field_len(BACKENDS_TAG))
            .sum::<usize>();
        let certificates = delta
            .removed_certificates
            .iter()
            .chain(delta.upserted_certificates.iter().map(|c| &c.name));
        len -= certificates
            .filter_map(|c| self.certificates.get(c.as_str()))
            .map(|c| c.field_len(CERTIFICATES_TAG))
            .sum::<usize>();
        let listeners = delta
            .removed_gateway_listeners
            .iter()
            .chain(delta.upserted_gateway_listeners.iter().map(|l| &l.name));
        len -= listeners
            .filter_map(|l| self.gateway_listeners.get(l.as_str()))
            .map(|l| l.field_len(GATEWAY_LISTENERS_TAG))
            .sum::<usize>();
        let gateway_hosts = delta
            .removed_gateway_hosts
            .iter()
            .chain(delta.upserted_gateway_hosts.iter().map(|g| &g.name));
        len -= gateway_hosts
            .filter_map(|g| self.gateway_hosts.get(g.as_str()))
            .map(|g| g.field_len(GATEWAY_HOSTS_TAG))
            .sum::<usize>();
        len += delta
            .upserted_gateway_listeners
            .iter()
            .map(|l| encoded_len(GATEWAY_LISTENERS_TAG, l))
            .sum::<usize>();
        len += delta
            .upserted_gateway_hosts
            .iter()
            .map(|g| encoded_len(GATEWAY_HOSTS_TAG, g))
            .sum::<usize>();
        len += delta
            .upserted_virtual_hosts
            .iter()
            .map(|v| encoded_len(VIRTUAL_HOSTS_TAG, v))
            .sum::<usize>();
        len += delta
            .upserted_backends
            .iter()
            .map(|b| encoded_len(BACKENDS_TAG, b))
            .sum::<usize>();
        len += delta
            .upserted_certificates
            .iter()
            .map(|c| encoded_len(CERTIFICATES_TAG, c))
            .sum::<usize>();
        let identity = Snapshot {
            version: delta.version.clone(),
            content_hash: delta.content_hash.clone(),
            cluster_revision: delta.cluster_revision,
            progress: delta.progress.clone(),
            default_backend: if delta.default_backend_changed {
                delta.default_backend.clone()
            } else {
                self.default_backend.as_deref().cloned()
            },
            default_certificate: if delta.default_certificate_changed {
                delta.default_certificate.clone()
            } else {
                self.default_certificate.clone()
            },
            ..Snapshot::default()
        };
        identity.encoded_len() + len
    }

    fn insert_backend(&mut self, b: &Backend, names: &dyn SharedNames) {
        let encoded = Encoded::new(b);
        self.resources_len += encoded.field_len(BACKENDS_TAG);
        let name = name_from(names, &self.backends, ResourceKind::Backend, &b.name);
        if let Some(old) = self.backends.insert(name, encoded) {
            self.resources_len -= old.field_len(BACKENDS_TAG);
        }
    }

    fn insert_certificate(&mut self, c: &Certificate, names: &dyn SharedNames) {
        let encoded = Encoded::new(c);
        self.resources_len += encoded.field_len(CERTIFICATES_TAG);
        let name = name_from(
            names,
            &self.certificates,
            ResourceKind::Certificate,
            &c.name,
        );
        if let Some(old) = self.certificates.insert(name, encoded) {
            self.resources_len -= old.field_len(CERTIFICATES_TAG);
        }
    }

    fn insert_host(&mut self, v: &VirtualHost, names: &dyn SharedNames) {
        let encoded = Encoded::new(v);
        self.resources_len += encoded.field_len(VIRTUAL_HOSTS_TAG);
        let host = name_from(
            names,
            &self.virtual_hosts,
            ResourceKind::VirtualHost,
            &v.host,
        );
        for r in &v.routes {
            self.backend_users
                .add(name_in(&self.backends, &r.backend), host.clone());
        }
        if !v.certificate.is_empty() {
            self.certificate_users
                .add(name_in(&self.certificates, &v.certificate), host.clone());
        }
        self.virtual_hosts.insert(host, encoded);
    }

    fn remove_host(&mut self, host: &str) {
        let Some(encoded) = self.virtual_hosts.remove(host) else {
            return;
        };
        self.resources_len -= encoded.field_len(VIRTUAL_HOSTS_TAG);
        let v = encoded.decode();
        for r in &v.routes {
            self.backend_users.remove(&r.backend, host);
        }
        self.certificate_users.remove(&v.certificate, host);
    }
}

impl Held {
    fn insert_listener(&mut self, l: &GatewayListener, names: &dyn SharedNames) {
        let encoded = Encoded::new(l);
        self.resources_len += encoded.field_len(GATEWAY_LISTENERS_TAG);
        let kind = ResourceKind::GatewayListener;
        let name = name_from(names, &self.gateway_listeners, kind, &l.name);
        for c in snapshot::listener_certificates(l) {
            self.certificate_users
                .add(name_in(&self.certificates, c), name.clone());
        }
        self.gateway_listeners.insert(name, encoded);
    }

    fn remove_listener(&mut self, name: &str) {
        let Some(encoded) = self.gateway_listeners.remove(name) else {
            return;
        };
        self.resources_len -= encoded.field_len(GATEWAY_LISTENERS_TAG);
        let l = encoded.decode();
        for c in snapshot::listener_certificates(&l) {
            self.certificate_users.remove(c, name);
        }
    }

    fn insert_gateway_host(&mut self, g: &GatewayHost, names: &dyn SharedNames) {
        let encoded = Encoded::new(g);
        self.resources_len += encoded.field_len(GATEWAY_HOSTS_TAG);
        let name = name_from(
            names,
            &self.gateway_hosts,
            ResourceKind::GatewayHost,
            &g.name,
        );
        for b in snapshot::gateway_host_backends(g) {
            self.backend_users
                .add(name_in(&self.backends, b), name.clone());
        }
        if !g.certificate.is_empty() {
            self.certificate_users
                .add(name_in(&self.certificates, &g.certificate), name.clone());
        }
        // An Ingress host has no Gateway listener to keep it with.
        if !snapshot::is_ingress_host(g) {
            self.listener_hosts
                .add(name_in(&self.gateway_listeners, &g.listener), name.clone());
        }
        self.gateway_hosts.insert(name, encoded);
    }

    fn remove_gateway_host(&mut self, name: &str) {
        let Some(encoded) = self.gateway_hosts.remove(name) else {
            return;
        };
        self.resources_len -= encoded.field_len(GATEWAY_HOSTS_TAG);
        let g = encoded.decode();
        for b in snapshot::gateway_host_backends(&g) {
            self.backend_users.remove(b, name);
        }
        self.certificate_users.remove(&g.certificate, name);
        self.listener_hosts.remove(&g.listener, name);
    }
}

fn bad_gateway(kind: &'static str, name: &str, reason: String) -> InvalidSnapshot {
    InvalidSnapshot::BadGateway {
        kind,
        name: name.to_owned(),
        reason,
    }
}

/// `name` as `held` keeps it (its key), or a copy of its own when `held` has no such
/// resource (yet).
fn name_in<T>(held: &BTreeMap<Arc<str>, T>, name: &str) -> Arc<str> {
    key_of(held, name).unwrap_or_else(|| name.into())
}

/// The key to hold a resource `name` of `kind` under: the one `held` has already (a
/// replaced resource keeps its key), else the copy `names` has, else a new one.
fn name_from<T>(
    names: &dyn SharedNames,
    held: &BTreeMap<Arc<str>, T>,
    kind: ResourceKind,
    name: &str,
) -> Arc<str> {
    let key = key_of(held, name)
        .or_else(|| names.shared(kind, name))
        .unwrap_or_else(|| name.into());
    debug_assert_eq!(&*key, name, "a shared name is the name asked for");
    key
}

/// Who uses what, as (name, user) pairs: a name's users are one range of the set. One
/// small entry per pair (a map of sets would make a hash table for each name), holding
/// the names the maps of resources hold ([`name_in`]), not copies.
#[derive(Debug, Clone, Default)]
struct Uses(BTreeSet<(Arc<str>, Arc<str>)>);

impl Uses {
    fn add(&mut self, name: Arc<str>, user: Arc<str>) {
        self.0.insert((name, user));
    }

    fn remove(&mut self, name: &str, user: &str) {
        self.0.remove(&(Arc::from(name), Arc::from(user)));
    }

    /// The users of `name`.
    fn of<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a str> + use<'a> {
        let from: (Arc<str>, Arc<str>) = (name.into(), "".into());
        let name = from.0.clone();
        self.0
            .range((Bound::Included(from), Bound::Unbounded))
            .take_while(move |(n, _)| *n == name)
            .map(|(_, user)| &**user)
    }
}

/// The names a delta touches in one kind of resource.
struct Names<'a> {
    upserted: HashSet<&'a str>,
    removed: HashSet<&'a str>,
    touched: HashSet<&'a str>,
}

impl Names<'_> {
    /// Whether a resource named `name` exists after the delta.
    fn after<T>(&self, name: &str, held: &BTreeMap<Arc<str>, T>) -> bool {
        self.upserted.contains(name) || (held.contains_key(name) && !self.removed.contains(name))
    }
}

/// The names a delta upserts and removes in one kind, refusing a name given twice and
/// the removal of one that is not held.
fn names<'a, T, R>(
    kind: &'static str,
    held: &BTreeMap<Arc<str>, T>,
    upserted: &'a [R],
    removed: &'a [String],
    name: impl Fn(&'a R) -> &'a String,
) -> Result<Names<'a>, InvalidDelta> {
    let mut out = Names {
        upserted: HashSet::new(),
        removed: HashSet::new(),
        touched: HashSet::new(),
    };
    for gone in removed {
        if !out.touched.insert(gone) {
            return Err(InvalidDelta::Duplicate {
                kind,
                name: gone.clone(),
            });
        }
        if !held.contains_key(gone.as_str()) {
            return Err(InvalidDelta::UnknownRemoval {
                kind,
                name: gone.clone(),
            });
        }
        out.removed.insert(gone);
    }
    for r in upserted {
        let n = name(r);
        if !out.touched.insert(n) {
            return Err(InvalidDelta::Duplicate {
                kind,
                name: n.clone(),
            });
        }
        out.upserted.insert(n);
    }
    Ok(out)
}

#[cfg(test)]
mod uses_tests {
    use std::sync::Arc;

    use super::{Held, Uses};
    use crate::delta::{Hashed, diff, inventory};
    use crate::v1::{Backend, MatchKind, Route, Snapshot, VirtualHost};

    #[test]
    fn a_names_users_are_its_own_when_another_name_starts_with_it() {
        let mut uses = Uses::default();
        let mut add = |name: &str, user: &str| uses.add(name.into(), user.into());
        add("a/b", "h1");
        add("a", "h2");
        add("a", "h3");
        add("a/bc", "h4");
        add("a", "h2");
        let of = |uses: &Uses, name: &str| uses.of(name).map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(of(&uses, "a"), ["h2", "h3"]);
        assert_eq!(of(&uses, "a/b"), ["h1"]);
        assert_eq!(of(&uses, "a/"), Vec::<String>::new());
        uses.remove("a", "h2");
        uses.remove("a", "h9");
        assert_eq!(of(&uses, "a"), ["h3"]);
        assert_eq!(of(&uses, "a/bc"), ["h4"]);
    }

    /// `hosts` as (host, backend), each backend in the snapshot.
    fn snapshot(hosts: &[(&str, &str)], revision: u64) -> Snapshot {
        let mut s = Snapshot {
            virtual_hosts: hosts
                .iter()
                .map(|(host, backend)| VirtualHost {
                    host: (*host).into(),
                    routes: vec![Route {
                        match_kind: MatchKind::Prefix as i32,
                        path: "/".into(),
                        backend: (*backend).into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            backends: hosts
                .iter()
                .map(|(_, backend)| Backend {
                    name: (*backend).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        crate::snapshot::seal(&mut s, revision);
        s
    }

    /// How many hold the name `key` of `held` (its key and each use of it).
    fn holders<T>(held: &std::collections::BTreeMap<Arc<str>, T>, key: &str) -> usize {
        let (key, _) = held.get_key_value(key).expect("held");
        Arc::strong_count(key)
    }

    #[test]
    fn a_name_is_held_once_by_its_resource_and_its_users() {
        let first = snapshot(&[("a.test", "ns/a:80")], 1);
        let mut held = Held::new(first.clone(), Hashed::of(&first));
        // The map's key and the host's use of it.
        assert_eq!(holders(&held.backends, "ns/a:80"), 2);
        assert_eq!(holders(&held.virtual_hosts, "a.test"), 2);

        // A delta that adds a host and the backend it uses.
        let next = snapshot(&[("a.test", "ns/a:80"), ("b.test", "ns/b:80")], 2);
        let delta = diff(&first.version, &inventory(&first), &next);
        let checked = held.check(&delta).expect("valid");
        held.commit(&delta, checked);
        assert_eq!(holders(&held.backends, "ns/b:80"), 2);
        assert_eq!(holders(&held.virtual_hosts, "b.test"), 2);
        assert_eq!(
            held.hosts_using_backend("ns/b:80").collect::<Vec<_>>(),
            ["b.test"]
        );
        assert_eq!(held.to_snapshot(), next);
    }
}
