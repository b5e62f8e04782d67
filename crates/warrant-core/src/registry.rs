//! The contract registry: compiled contracts resolved by exact version or content id, cached
//! in process and backed by the store. Cached entries are re-read after a short time-to-live,
//! so a retirement made on another node takes effect within that time; a server's contract
//! sync, which lists the stored contracts every second, reloads them when they changed
//! ([`Registry::load`]) or confirms them fresh ([`Registry::confirm`]), so its requests do not
//! re-read them.
//!
//! **Misses.** While the registry holds a complete listing younger than the time-to-live (the
//! sync's, or the one it started with), a name, version or content id it does not hold is not
//! stored either (as of that listing): it answers "none" without asking the store. So a call
//! into a caller's own namespace that only the platform's holds — most calls — costs no store
//! read. Without a fresh listing (a registry nobody syncs, or a store the sync cannot read),
//! every miss is read from the store, and a contract registered on another node is found on
//! first use; with one, within one sync.
//!
//! Contracts live in namespaces ([`Namespace`]): a caller of tenant `t` resolves a name or
//! content id in `t`'s own namespace first, then the platform's, and never sees another
//! tenant's. What is cached is always what the store holds: a registration caches the stored
//! record (with the stored binding), never the caller's copy.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use time::{Duration, OffsetDateTime};

use crate::contract::{Contract, Namespace};
use crate::decision::{RejectCode, Rejection};
use crate::proposal::{Envelope, check_selector};
use crate::records::{Registration, StoredContract};
use crate::store::{Store, StoreError};

type Names = foldhash::HashMap<String, BTreeMap<u32, Entry>>;

/// The cached contracts by namespace: the platform's, and each tenant's.
#[derive(Default)]
struct Spaces {
    platform: Names,
    tenants: foldhash::HashMap<String, Names>,
}

impl Spaces {
    fn names(&self, tenant: Option<&str>) -> Option<&Names> {
        match tenant {
            None => Some(&self.platform),
            Some(t) => self.tenants.get(t),
        }
    }

    fn names_mut(&mut self, namespace: &Namespace) -> &mut Names {
        match namespace {
            Namespace::Platform => &mut self.platform,
            Namespace::Tenant(t) => self.tenants.entry(t.clone()).or_default(),
        }
    }

    fn entries_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.platform
            .values_mut()
            .chain(self.tenants.values_mut().flat_map(foldhash::HashMap::values_mut))
            .flat_map(BTreeMap::values_mut)
    }
}

#[derive(Clone)]
struct Entry {
    contract: Arc<Contract>,
    retired_at: Option<OffsetDateTime>,
    fetched_at: OffsetDateTime,
}

/// How an author pins a contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin<'a> {
    /// `name@version`.
    Version(&'a str, u32),
    /// `tool-contract@sha256:…`.
    ContentId(&'a str),
}

/// The registry (see the module documentation).
pub struct Registry {
    store: Arc<dyn Store>,
    /// namespace → name → version → entry; nested so a lookup borrows the tenant and the
    /// proposal's name (and a name has few versions: an ordered map, no hashing).
    by_version: RwLock<Spaces>,
    /// (namespace, content id) → name and version.
    by_id: RwLock<HashMap<(Namespace, String), (String, u32)>>,
    /// When the registry last held every stored contract (see "Misses" in the module
    /// documentation).
    listed_at: RwLock<Option<OffsetDateTime>>,
    ttl: Duration,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("ttl", &self.ttl).finish()
    }
}

impl Registry {
    /// A registry over `store`; cached entries are re-read after `ttl`.
    pub fn new(store: Arc<dyn Store>, ttl: Duration) -> Self {
        Registry {
            store,
            by_version: RwLock::default(),
            by_id: RwLock::default(),
            listed_at: RwLock::default(),
            ttl,
        }
    }

    /// Registers a linted contract in its namespace (a no-op for the same body; a conflict for
    /// another body or binding under the same name@version) and caches what the store then
    /// holds — the stored binding, not the caller's.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] and the store's other errors.
    pub async fn register(
        &self,
        contract: Contract,
        now: OffsetDateTime,
    ) -> Result<Registration, StoreError> {
        let outcome = self.store.register_contract(&contract.to_stored(now)).await?;
        let stored = self
            .store
            .get_contract(contract.namespace(), contract.name(), contract.version())
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt(format!("{} vanished after its registration", contract.id()))
            })?;
        self.insert(Arc::new(compile(&stored)?), stored.retired_at, now);
        Ok(outcome)
    }

    /// Caches the stored contracts the caller has just listed — every one of them, with their
    /// retirements, fresh as of `now` — and returns them in the same order (for policy
    /// schemas). A contract already cached under the same content id is reused, the others are
    /// compiled; nothing is cached if one fails. Until the time-to-live passes, a contract not
    /// in `stored` is taken as not stored (module documentation, "Misses").
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] for a stored contract that no longer lints.
    pub fn load(
        &self,
        stored: &[StoredContract],
        now: OffsetDateTime,
    ) -> Result<Vec<Arc<Contract>>, StoreError> {
        let compiled = stored
            .iter()
            .map(|s| {
                let reusable = self
                    .compiled(&s.namespace, &s.content_id)
                    .filter(|c| c.adapter().map(|a| a.digest().text()) == s.binding_digest);
                let contract = match reusable {
                    Some(contract) => contract,
                    None => Arc::new(compile(s)?),
                };
                Ok((contract, s.retired_at))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let loaded = compiled
            .into_iter()
            .map(|(contract, retired_at)| {
                self.insert(contract.clone(), retired_at, now);
                contract
            })
            .collect();
        self.listed(now);
        Ok(loaded)
    }

    /// Retires a contract of `namespace`: new calls are refused from now on.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn retire(
        &self,
        namespace: &Namespace,
        content_id: &str,
        now: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let done = self.store.retire_contract(namespace, content_id, now).await?;
        let key = (namespace.clone(), content_id.to_owned());
        let found = self.by_id.read().ok().and_then(|m| m.get(&key).cloned());
        if let (Some((name, version)), Ok(mut map)) = (found, self.by_version.write())
            && let Some(entry) = map
                .names_mut(namespace)
                .get_mut(&name)
                .and_then(|v| v.get_mut(&version))
        {
            entry.retired_at.get_or_insert(now);
        }
        Ok(done)
    }

    /// Resolves the contract an envelope names for a caller of `tenant`, by exact version or
    /// content id: the tenant's own namespace first, then the platform's.
    ///
    /// # Errors
    /// `Ok(Err(rejection))` for contract-stage refusals (unknown, mismatched, retired);
    /// `Err` when the store cannot answer.
    pub async fn resolve(
        &self,
        envelope: &Envelope,
        tenant: &str,
        now: OffsetDateTime,
    ) -> Result<Result<Arc<Contract>, Rejection>, StoreError> {
        let mut entry = None;
        for space in [Some(tenant), None] {
            entry = match (envelope.version(), envelope.contract()) {
                (Some(version), _) => self.by_version(space, envelope.tool(), version, now).await?,
                (None, Some(id)) => {
                    self.by_content_id(&namespace_of(space), &id.to_string(), now)
                        .await?
                }
                (None, None) => None,
            };
            if entry.is_some() {
                break;
            }
        }
        let Some(entry) = entry else {
            // The tool exists but not as pinned: say which pin is wrong.
            if let Some(known) = self.known_versions(tenant, envelope.tool()) {
                let name: String = envelope.tool().chars().take(64).collect();
                let rejection = match envelope.version() {
                    Some(version) => Rejection::new(
                        RejectCode::ContractVersionMismatch,
                        format!("no version {version} of `{name}`; registered: {known}"),
                    )
                    .at("/version"),
                    None => Rejection::new(
                        RejectCode::ContractIdMismatch,
                        format!("no version of `{name}` has the pinned content id; registered: {known}"),
                    )
                    .at("/contract"),
                };
                return Ok(Err(rejection));
            }
            return Ok(Err(not_found(envelope)));
        };
        if let Err(rejection) = check_selector(envelope, &entry.contract) {
            return Ok(Err(rejection));
        }
        if entry.retired_at.is_some_and(|at| at <= now) {
            return Ok(Err(Rejection::new(
                RejectCode::ContractRetired,
                format!(
                    "{}@{} is retired and refuses new calls",
                    entry.contract.name(),
                    entry.contract.version()
                ),
            )
            .at("/tool")));
        }
        Ok(Ok(entry.contract))
    }

    /// The contract with `content_id` a caller of `tenant` can see (its own namespace first,
    /// then the platform's), loading it if needed (for reviews and reconciliation of stored
    /// calls).
    ///
    /// # Errors
    /// The store's errors.
    pub async fn by_id(
        &self,
        tenant: &str,
        content_id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Arc<Contract>>, StoreError> {
        Ok(self
            .find_pinned(tenant, Pin::ContentId(content_id), now)
            .await?
            .map(|(contract, _)| contract))
    }

    /// The contract a pin names for a caller of `tenant` — `name@version` or a content id, its
    /// own namespace first, then the platform's — and whether it is retired at `now`. For
    /// authoring (a workflow pins what it calls), where a retired contract is refused with an
    /// error of its own rather than a call's rejection.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn find_pinned(
        &self,
        tenant: &str,
        pin: Pin<'_>,
        now: OffsetDateTime,
    ) -> Result<Option<(Arc<Contract>, bool)>, StoreError> {
        for space in [Some(tenant), None] {
            let entry = match pin {
                Pin::Version(name, version) => self.by_version(space, name, version, now).await?,
                Pin::ContentId(id) => self.by_content_id(&namespace_of(space), id, now).await?,
            };
            if let Some(entry) = entry {
                let retired = entry.retired_at.is_some_and(|at| at <= now);
                return Ok(Some((entry.contract, retired)));
            }
        }
        Ok(None)
    }

    /// `name@version` in the tenant's namespace (`Some`) or the platform's (`None`).
    async fn by_version(
        &self,
        space: Option<&str>,
        name: &str,
        version: u32,
        now: OffsetDateTime,
    ) -> Result<Option<Entry>, StoreError> {
        if let Some(entry) = self.cached(space, name, version, now) {
            return Ok(Some(entry));
        }
        if self.miss_is_known(now) && !self.holds(space, name, version) {
            return Ok(None);
        }
        match self
            .store
            .get_contract(&namespace_of(space), name, version)
            .await?
        {
            Some(stored) => Ok(Some(self.insert(
                Arc::new(compile(&stored)?),
                stored.retired_at,
                now,
            ))),
            None => Ok(None),
        }
    }

    async fn by_content_id(
        &self,
        namespace: &Namespace,
        id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Entry>, StoreError> {
        let key = (namespace.clone(), id.to_owned());
        let found = self.by_id.read().ok().and_then(|m| m.get(&key).cloned());
        if let Some(entry) =
            found.and_then(|(name, version)| self.cached(namespace.tenant(), &name, version, now))
        {
            return Ok(Some(entry));
        }
        if self.miss_is_known(now) && !self.holds_id(&key) {
            return Ok(None);
        }
        match self.store.get_contract_by_id(namespace, id).await? {
            Some(stored) => Ok(Some(self.insert(
                Arc::new(compile(&stored)?),
                stored.retired_at,
                now,
            ))),
            None => Ok(None),
        }
    }

    /// The versions of `name` a caller of `tenant` has been seen to have, e.g. `1, 2`.
    fn known_versions(&self, tenant: &str, name: &str) -> Option<String> {
        let map = self.by_version.read().ok()?;
        let mut versions: Vec<u32> = [Some(tenant), None]
            .into_iter()
            .filter_map(|space| map.names(space)?.get(name))
            .flat_map(|v| v.keys().copied())
            .collect();
        versions.sort_unstable();
        versions.dedup();
        (!versions.is_empty()).then(|| versions.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
    }

    /// Marks every cached entry fresh as of `now`: the caller has just listed the stored
    /// contracts and found them as last [loaded](Registry::load) (the contract sync), so the
    /// listing is complete again as of `now`.
    pub fn confirm(&self, now: OffsetDateTime) {
        if let Ok(mut map) = self.by_version.write() {
            for entry in map.entries_mut() {
                entry.fetched_at = now;
            }
        }
        self.listed(now);
    }

    /// Records a complete listing as of `now`.
    fn listed(&self, now: OffsetDateTime) {
        if let Ok(mut at) = self.listed_at.write() {
            *at = Some(now);
        }
    }

    /// Whether a miss can be answered without the store: the last complete listing is younger
    /// than the time-to-live.
    fn miss_is_known(&self, now: OffsetDateTime) -> bool {
        self.listed_at
            .read()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| now - at < self.ttl)
    }

    /// The compiled contract cached under `content_id` in `namespace`, whatever its age.
    fn compiled(&self, namespace: &Namespace, content_id: &str) -> Option<Arc<Contract>> {
        let key = (namespace.clone(), content_id.to_owned());
        let (name, version) = self.by_id.read().ok()?.get(&key).cloned()?;
        let map = self.by_version.read().ok()?;
        let entry = map.names(namespace.tenant())?.get(&name)?.get(&version)?;
        (entry.contract.id_str() == content_id).then(|| entry.contract.clone())
    }

    /// Whether `name@version` of `space` is held, however old.
    fn holds(&self, space: Option<&str>, name: &str, version: u32) -> bool {
        self.by_version
            .read()
            .ok()
            .and_then(|map| Some(map.names(space)?.get(name)?.contains_key(&version)))
            .unwrap_or(false)
    }

    /// Whether a content id is held, however old.
    fn holds_id(&self, key: &(Namespace, String)) -> bool {
        self.by_id.read().is_ok_and(|map| map.contains_key(key))
    }

    fn cached(&self, space: Option<&str>, name: &str, version: u32, now: OffsetDateTime) -> Option<Entry> {
        let map = self.by_version.read().ok()?;
        map.names(space)?
            .get(name)?
            .get(&version)
            .filter(|e| now - e.fetched_at < self.ttl)
            .cloned()
    }

    fn insert(
        &self,
        contract: Arc<Contract>,
        retired_at: Option<OffsetDateTime>,
        now: OffsetDateTime,
    ) -> Entry {
        let namespace = contract.namespace().clone();
        let (name, version) = (contract.name().to_owned(), contract.version());
        let entry = Entry {
            contract: contract.clone(),
            retired_at,
            fetched_at: now,
        };
        if let Ok(mut map) = self.by_version.write() {
            map.names_mut(&namespace)
                .entry(name.clone())
                .or_default()
                .insert(version, entry.clone());
        }
        if let Ok(mut map) = self.by_id.write() {
            map.insert((namespace, contract.id_str().to_owned()), (name, version));
        }
        entry
    }
}

/// The namespace of a tenant's space (`Some`) or the platform's (`None`). A caller of tenant `t`
/// looks in `[Some(t), None]`, in that order.
fn namespace_of(space: Option<&str>) -> Namespace {
    space.map_or(Namespace::Platform, |t| Namespace::Tenant(t.to_owned()))
}

fn compile(stored: &StoredContract) -> Result<Contract, StoreError> {
    Contract::from_stored(stored).map_err(|problems| {
        let first = problems.first().map(ToString::to_string).unwrap_or_default();
        StoreError::Corrupt(format!(
            "stored contract {} fails to load: {first}",
            stored.content_id
        ))
    })
}

fn not_found(envelope: &Envelope) -> Rejection {
    let name: String = envelope.tool().chars().take(64).collect();
    match (envelope.version(), envelope.contract()) {
        (Some(v), _) => {
            Rejection::new(RejectCode::ContractNotFound, format!("no contract {name}@{v}")).at("/tool")
        }
        (None, Some(id)) => {
            Rejection::new(RejectCode::ContractNotFound, format!("no contract with id {id}")).at("/contract")
        }
        (None, None) => Rejection::new(
            RejectCode::ContractNotFound,
            format!("no contract named `{name}`"),
        )
        .at("/tool"),
    }
}
