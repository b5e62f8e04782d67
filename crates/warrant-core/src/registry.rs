//! The contract registry: compiled contracts resolved by exact version or content id, cached
//! in process and backed by the store, so contracts registered on another node are found on
//! first use. Cached entries are re-read after a short time-to-live, so a retirement made on
//! another node takes effect within that time; a server's contract sync, which lists the
//! stored contracts every second, reloads them when they changed ([`Registry::load`]) or
//! confirms them fresh ([`Registry::confirm`]), so its requests do not re-read them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use time::{Duration, OffsetDateTime};

use crate::contract::Contract;
use crate::decision::{RejectCode, Rejection};
use crate::proposal::{Envelope, check_selector};
use crate::records::{Registration, StoredContract};
use crate::store::{Store, StoreError};

#[derive(Clone)]
struct Entry {
    contract: Arc<Contract>,
    retired_at: Option<OffsetDateTime>,
    fetched_at: OffsetDateTime,
}

/// The registry (see the module documentation).
pub struct Registry {
    store: Arc<dyn Store>,
    /// name → version → entry; nested so a lookup borrows the proposal's name (and a
    /// name has few versions: an ordered map, no hashing).
    by_version: RwLock<HashMap<String, BTreeMap<u32, Entry>>>,
    by_id: RwLock<HashMap<String, (String, u32)>>,
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
            ttl,
        }
    }

    /// Registers a linted contract (a no-op for the same body; a conflict for another body
    /// under the same name@version) and caches it.
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
            .get_contract(contract.name(), contract.version())
            .await?;
        self.insert(Arc::new(contract), stored.and_then(|s| s.retired_at), now);
        Ok(outcome)
    }

    /// Caches stored contracts the caller has read from the store (with their retirements,
    /// fresh as of `now`); returns them in the same order (for policy schemas). A contract
    /// already cached under the same content id is reused, the others are compiled; nothing is
    /// cached if one fails.
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
                let contract = match self.compiled(&s.content_id) {
                    Some(contract) => contract,
                    None => Arc::new(compile(s)?),
                };
                Ok((contract, s.retired_at))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(compiled
            .into_iter()
            .map(|(contract, retired_at)| {
                self.insert(contract.clone(), retired_at, now);
                contract
            })
            .collect())
    }

    /// Retires a contract: new calls are refused from now on.
    ///
    /// # Errors
    /// The store's errors.
    pub async fn retire(&self, content_id: &str, now: OffsetDateTime) -> Result<bool, StoreError> {
        let done = self.store.retire_contract(content_id, now).await?;
        let key = self.by_id.read().ok().and_then(|m| m.get(content_id).cloned());
        if let (Some((name, version)), Ok(mut map)) = (key, self.by_version.write()) {
            if let Some(entry) = map.get_mut(&name).and_then(|v| v.get_mut(&version)) {
                entry.retired_at.get_or_insert(now);
            }
        }
        Ok(done)
    }

    /// Resolves the contract an envelope names, by exact version or content id.
    ///
    /// # Errors
    /// `Ok(Err(rejection))` for contract-stage refusals (unknown, mismatched, retired);
    /// `Err` when the store cannot answer.
    pub async fn resolve(
        &self,
        envelope: &Envelope,
        now: OffsetDateTime,
    ) -> Result<Result<Arc<Contract>, Rejection>, StoreError> {
        let entry = match (envelope.version(), envelope.contract()) {
            (Some(version), _) => self.by_version(envelope.tool(), version, now).await?,
            (None, Some(id)) => self.by_content_id(&id.to_string(), now).await?,
            (None, None) => None,
        };
        let Some(entry) = entry else {
            // The tool exists but not as pinned: say which pin is wrong.
            if let Some(known) = self.known_versions(envelope.tool()) {
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

    /// A cached contract by content id, loading it if needed (for reviews of stored approvals).
    ///
    /// # Errors
    /// The store's errors.
    pub async fn by_id(
        &self,
        content_id: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Arc<Contract>>, StoreError> {
        Ok(self.by_content_id(content_id, now).await?.map(|e| e.contract))
    }

    async fn by_version(
        &self,
        name: &str,
        version: u32,
        now: OffsetDateTime,
    ) -> Result<Option<Entry>, StoreError> {
        if let Some(entry) = self.cached(name, version, now) {
            return Ok(Some(entry));
        }
        match self.store.get_contract(name, version).await? {
            Some(stored) => Ok(Some(self.insert(
                Arc::new(compile(&stored)?),
                stored.retired_at,
                now,
            ))),
            None => Ok(None),
        }
    }

    async fn by_content_id(&self, id: &str, now: OffsetDateTime) -> Result<Option<Entry>, StoreError> {
        let key = self.by_id.read().ok().and_then(|m| m.get(id).cloned());
        if let Some(entry) = key.and_then(|(name, version)| self.cached(&name, version, now)) {
            return Ok(Some(entry));
        }
        match self.store.get_contract_by_id(id).await? {
            Some(stored) => Ok(Some(self.insert(
                Arc::new(compile(&stored)?),
                stored.retired_at,
                now,
            ))),
            None => Ok(None),
        }
    }

    /// The versions of `name` this registry has seen, e.g. `1, 2`.
    fn known_versions(&self, name: &str) -> Option<String> {
        let map = self.by_version.read().ok()?;
        let versions: Vec<u32> = map.get(name)?.keys().copied().collect();
        (!versions.is_empty()).then(|| versions.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))
    }

    /// Marks every cached entry fresh as of `now`: the caller has just read the stored
    /// contracts and found them as cached (the contract sync).
    pub fn confirm(&self, now: OffsetDateTime) {
        if let Ok(mut map) = self.by_version.write() {
            for entry in map.values_mut().flat_map(BTreeMap::values_mut) {
                entry.fetched_at = now;
            }
        }
    }

    /// The compiled contract cached under `content_id`, whatever its age.
    fn compiled(&self, content_id: &str) -> Option<Arc<Contract>> {
        let (name, version) = self.by_id.read().ok()?.get(content_id).cloned()?;
        let map = self.by_version.read().ok()?;
        let entry = map.get(&name)?.get(&version)?;
        (entry.contract.id_str() == content_id).then(|| entry.contract.clone())
    }

    fn cached(&self, name: &str, version: u32, now: OffsetDateTime) -> Option<Entry> {
        let map = self.by_version.read().ok()?;
        map.get(name)?
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
        let key = (contract.name().to_owned(), contract.version());
        let entry = Entry {
            contract: contract.clone(),
            retired_at,
            fetched_at: now,
        };
        if let Ok(mut map) = self.by_version.write() {
            map.entry(key.0.clone()).or_default().insert(key.1, entry.clone());
        }
        if let Ok(mut map) = self.by_id.write() {
            map.insert(contract.id_str().to_owned(), key);
        }
        entry
    }
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
