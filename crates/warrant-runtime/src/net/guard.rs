//! The SSRF guard: which addresses count as public, the operator's allow rules, and the vetting of
//! a URL host (literal or resolved name) before anything is dialed.
//!
//! The address rule is an allow-list for IPv6 (only global unicast `2000::/3`, minus the special
//! blocks inside it, plus the translation prefixes whose embedded IPv4 is itself public) and a
//! deny-list of the IANA special-purpose blocks for IPv4. Anything not clearly public is refused:
//! a wrong refusal is an operator's allow rule away, a wrong acceptance is a breach.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{NetError, Resolver};

/// Names that reach a cloud provider's instance metadata service; refused before resolution
/// unless the operator lists the exact name.
const METADATA_NAMES: &[&str] = &[
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.azure.internal",
];

/// The IPv4 special-purpose blocks that are not public destinations: (network, prefix, class).
const V4_BLOCKS: &[(u32, u8, &str)] = &[
    (0x0000_0000, 8, "unspecified (0.0.0.0/8)"),
    (0x0a00_0000, 8, "private (10.0.0.0/8)"),
    (0x6440_0000, 10, "shared address space (100.64.0.0/10)"),
    (0x7f00_0000, 8, "loopback (127.0.0.0/8)"),
    (0xa9fe_0000, 16, "link-local (169.254.0.0/16)"),
    (0xac10_0000, 12, "private (172.16.0.0/12)"),
    (0xc000_0000, 24, "protocol assignments (192.0.0.0/24)"),
    (0xc000_0200, 24, "documentation (192.0.2.0/24)"),
    (0xc058_6300, 24, "6to4 relay anycast (192.88.99.0/24)"),
    (0xc0a8_0000, 16, "private (192.168.0.0/16)"),
    (0xc612_0000, 15, "benchmarking (198.18.0.0/15)"),
    (0xc633_6400, 24, "documentation (198.51.100.0/24)"),
    (0xcb00_7100, 24, "documentation (203.0.113.0/24)"),
    (0xe000_0000, 4, "multicast (224.0.0.0/4)"),
    (0xffff_ffff, 32, "broadcast (255.255.255.255)"),
    (0xf000_0000, 4, "reserved (240.0.0.0/4)"),
];

/// Why an address is not public.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// A special-purpose block, by its description.
    Block(&'static str),
    /// An IPv6 translation or tunnel address (`via`) embedding a non-public IPv4.
    Embedded {
        via: &'static str,
        v4: Ipv4Addr,
        class: &'static str,
    },
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Block(class) => f.write_str(class),
            Self::Embedded { via, v4, class } => write!(f, "{via} embedding {v4}, {class}"),
        }
    }
}

/// Whether `ip` is a public unicast address, one Warrant may connect to without an allow rule.
///
/// Refused: loopback, unspecified, private, shared (CGNAT), link-local (including the cloud
/// metadata address 169.254.169.254), unique-local, site-local, multicast, broadcast, the
/// documentation, benchmarking and reserved blocks, every IPv4-compatible address (`::/96`,
/// deprecated and never routed), the local-use NAT64 prefix, Teredo and the rest of the
/// IETF protocol block `2001::/23`, and anything outside `2000::/3`. IPv4-mapped
/// (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses are judged by
/// the IPv4 address they embed.
#[must_use]
pub fn is_public(ip: IpAddr) -> bool {
    class(ip).is_none()
}

/// The reason `ip` is not public, or `None` when it is.
pub(crate) fn class(ip: IpAddr) -> Option<Class> {
    match ip {
        IpAddr::V4(v4) => class_v4(v4).map(Class::Block),
        IpAddr::V6(v6) => class_v6(v6),
    }
}

fn class_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(ip);
    V4_BLOCKS
        .iter()
        .find(|(network, prefix, _)| bits & mask32(*prefix) == *network)
        .map(|(_, _, class)| *class)
}

fn class_v6(ip: Ipv6Addr) -> Option<Class> {
    let bits = u128::from(ip);
    let embedded =
        |via: &'static str, v4: Ipv4Addr| class_v4(v4).map(|class| Class::Embedded { via, v4, class });
    if ip.is_unspecified() {
        return Some(Class::Block("unspecified (::)"));
    }
    if ip.is_loopback() {
        return Some(Class::Block("loopback (::1)"));
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return embedded("ipv4-mapped address", v4);
    }
    if in_v6(bits, 0, 96) {
        return Some(Class::Block("ipv4-compatible (::/96)"));
    }
    if in_v6(bits, 0x0064_ff9b_u128 << 96, 96) {
        return embedded("nat64 address", low_v4(bits));
    }
    if in_v6(bits, 0x2002_u128 << 112, 16) {
        // 6to4: the IPv4 address is in bits 16..48.
        return embedded(
            "6to4 address",
            Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32),
        );
    }
    const V6_BLOCKS: &[(u128, u8, &str)] = &[
        (
            0x0064_ff9b_0001_u128 << 80,
            48,
            "local-use nat64 (64:ff9b:1::/48)",
        ),
        (0x0100_u128 << 112, 64, "discard-only (100::/64)"),
        (0xfc00_u128 << 112, 7, "unique-local (fc00::/7)"),
        (0xfe80_u128 << 112, 10, "link-local (fe80::/10)"),
        (0xfec0_u128 << 112, 10, "site-local (fec0::/10)"),
        (0xff00_u128 << 112, 8, "multicast (ff00::/8)"),
        (0x2001_0000_u128 << 96, 32, "teredo (2001::/32)"),
        (0x2001_0000_u128 << 96, 23, "protocol assignments (2001::/23)"),
        (0x2001_0db8_u128 << 96, 32, "documentation (2001:db8::/32)"),
        (0x3fff_u128 << 112, 20, "documentation (3fff::/20)"),
    ];
    if let Some((_, _, class)) = V6_BLOCKS
        .iter()
        .find(|(network, prefix, _)| in_v6(bits, *network, *prefix))
    {
        return Some(Class::Block(class));
    }
    if !in_v6(bits, 0x2000_u128 << 112, 3) {
        return Some(Class::Block("not global unicast (outside 2000::/3)"));
    }
    None
}

fn low_v4(bits: u128) -> Ipv4Addr {
    Ipv4Addr::from((bits & 0xffff_ffff) as u32)
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(prefix.min(128)))
        .unwrap_or(0)
}

fn in_v6(bits: u128, network: u128, prefix: u8) -> bool {
    bits & mask128(prefix) == network
}

/// An address block from an allow rule (a single address is a full-length prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn parse(entry: &str) -> Option<Self> {
        let (addr, prefix) = match entry.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix.parse::<u8>().ok()?)),
            None => (entry, None),
        };
        let addr = addr
            .strip_prefix('[')
            .and_then(|a| a.strip_suffix(']'))
            .unwrap_or(addr);
        let addr = addr.parse::<IpAddr>().ok()?.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        (prefix <= max).then_some(Self { addr, prefix })
    }

    fn contains(self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = mask32(self.prefix);
                u32::from(ip) & mask == u32::from(net) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = mask128(self.prefix);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }
}

/// The operator's allow rules (`NetPolicy::allow_hosts`), compiled once per client.
#[derive(Debug, Clone, Default)]
pub(crate) struct AllowRules {
    names: Vec<String>,
    nets: Vec<Net>,
}

impl AllowRules {
    /// Entries that parse as an address or CIDR block are address rules; any other entry is an
    /// exact host name (compared case-insensitively, trailing dots ignored).
    pub(crate) fn compile(entries: &[String]) -> Self {
        let mut rules = Self::default();
        for entry in entries {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            if let Some(net) = Net::parse(entry) {
                rules.nets.push(net);
            } else if entry.contains('/') {
                tracing::warn!(
                    entry,
                    "ignoring an allow_hosts entry that is neither a host nor a CIDR block"
                );
            } else {
                rules.names.push(normalize_name(entry));
            }
        }
        rules
    }

    fn allows_name(&self, name: &str) -> bool {
        self.names.iter().any(|allowed| allowed == name)
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(ip))
    }
}

/// A host name lowercased, without trailing dots (`Localhost.` and `localhost` are one name).
fn normalize_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn is_localhost_name(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

/// The host part of a destination: an address literal or a name to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Ip(IpAddr),
    Name(String),
}

impl Target {
    /// Reads a host as it appears in a URI (`[v6]` bracketed); a name is normalized, and a name
    /// that is an address once normalized is treated as that address.
    pub(crate) fn parse(host: &str) -> Self {
        let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        if let Some(Ok(ip)) = bracketed.map(str::parse::<Ipv6Addr>) {
            return Self::Ip(IpAddr::V6(ip));
        }
        let name = normalize_name(host);
        match name.parse::<IpAddr>() {
            Ok(ip) => Self::Ip(ip),
            Err(_) => Self::Name(name),
        }
    }
}

/// What remains to be done after the checks that need no resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// An address literal that passed: dial exactly this.
    Literal(IpAddr),
    /// A name to resolve; `name_allowed` when the operator lists it, `plain_http` when the
    /// scheme is `http` and plain http is not generally allowed (so every resolved address must
    /// be covered by an address rule).
    Resolve {
        name: String,
        name_allowed: bool,
        plain_http: bool,
    },
}

/// The vetting rules of one client.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    rules: AllowRules,
    allow_plain_http: bool,
}

impl Guard {
    pub(crate) fn new(allow_hosts: &[String], allow_plain_http: bool) -> Self {
        Self {
            rules: AllowRules::compile(allow_hosts),
            allow_plain_http,
        }
    }

    /// Everything that can be decided without resolving: the scheme, address literals, and the
    /// loopback and metadata names. `scheme` is `http` or `https` (the caller checked).
    pub(crate) fn plan(&self, https: bool, target: &Target) -> Result<Plan, NetError> {
        match target {
            Target::Ip(ip) => {
                let ip = *ip;
                if self.rules.allows_ip(ip) {
                    return Ok(Plan::Literal(ip));
                }
                if let Some(class) = class(ip) {
                    return Err(NetError::Refused(format!("{ip} is {class}")));
                }
                if !https && !self.allow_plain_http {
                    return Err(plain_http_refused(&ip.to_string()));
                }
                Ok(Plan::Literal(ip))
            }
            Target::Name(name) => {
                let name_allowed = self.rules.allows_name(name);
                if !name_allowed {
                    if is_localhost_name(name) {
                        return Err(NetError::Refused(format!("{name} is a loopback name")));
                    }
                    if METADATA_NAMES.contains(&name.as_str()) {
                        return Err(NetError::Refused(format!("{name} is a cloud metadata name")));
                    }
                }
                Ok(Plan::Resolve {
                    name: name.clone(),
                    name_allowed,
                    plain_http: !https && !self.allow_plain_http && !name_allowed,
                })
            }
        }
    }

    /// Vets a name's resolved addresses: refused if ANY is not public and not allowed (a name
    /// allowed by the operator accepts all of its addresses).
    pub(crate) fn vet_resolved(
        &self,
        name: &str,
        name_allowed: bool,
        plain_http: bool,
        addrs: &[IpAddr],
    ) -> Result<(), NetError> {
        if addrs.is_empty() {
            return Err(NetError::Resolve(format!("{name} has no addresses")));
        }
        if name_allowed {
            return Ok(());
        }
        for ip in addrs {
            if self.rules.allows_ip(*ip) {
                continue;
            }
            if let Some(class) = class(*ip) {
                return Err(NetError::Refused(format!("{name} resolves to {ip}, {class}")));
            }
            if plain_http {
                return Err(plain_http_refused(name));
            }
        }
        Ok(())
    }

    /// The whole vetting of one destination: the addresses that may be dialed, in resolver order,
    /// without duplicates. A literal is never resolved.
    pub(crate) async fn vet(
        &self,
        https: bool,
        host: &str,
        port: u16,
        resolver: &dyn Resolver,
    ) -> Result<Vec<IpAddr>, NetError> {
        match self.plan(https, &Target::parse(host))? {
            Plan::Literal(ip) => Ok(vec![ip.to_canonical()]),
            Plan::Resolve {
                name,
                name_allowed,
                plain_http,
            } => {
                let addrs = resolver
                    .resolve(&name, port)
                    .await
                    .map_err(|err| NetError::Resolve(format!("{name}: {err}")))?;
                self.vet_resolved(&name, name_allowed, plain_http, &addrs)?;
                let mut vetted: Vec<IpAddr> = Vec::with_capacity(addrs.len());
                for ip in addrs.into_iter().map(|ip| ip.to_canonical()) {
                    if !vetted.contains(&ip) {
                        vetted.push(ip);
                    }
                }
                Ok(vetted)
            }
        }
    }
}

fn plain_http_refused(host: &str) -> NetError {
    NetError::Refused(format!("plain http to {host} is not allowed (https only)"))
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        reason = "tests"
    )]

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn non_public_addresses() {
        let table = [
            // IPv4
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("10.0.0.1", "private"),
            ("10.255.255.255", "private"),
            ("100.64.0.1", "shared"),
            ("100.127.255.255", "shared"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.0.1", "link-local"),
            ("169.254.169.254", "link-local"),
            ("172.16.0.1", "private"),
            ("172.16.5.4", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.1", "protocol"),
            ("192.0.0.170", "protocol"),
            ("192.0.2.1", "documentation"),
            ("192.88.99.1", "6to4 relay"),
            ("192.168.0.1", "private"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.254", "reserved"),
            ("255.255.255.255", "broadcast"),
            // IPv6
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "ipv4-mapped"),
            ("::ffff:7f00:1", "ipv4-mapped"),
            ("::ffff:10.0.0.1", "ipv4-mapped"),
            ("::ffff:169.254.169.254", "ipv4-mapped"),
            ("::ffff:0.0.0.0", "ipv4-mapped"),
            ("::127.0.0.1", "ipv4-compatible"),
            ("::10.0.0.1", "ipv4-compatible"),
            ("::8.8.8.8", "ipv4-compatible"),
            ("64:ff9b::127.0.0.1", "nat64"),
            ("64:ff9b::a9fe:a9fe", "nat64"),
            ("64:ff9b::192.168.0.1", "nat64"),
            ("64:ff9b:1::8.8.8.8", "local-use nat64"),
            ("2002:7f00:1::", "6to4"),
            ("2002:a00:1::1", "6to4"),
            ("2002:a9fe:a9fe::1", "6to4"),
            ("100::1", "discard"),
            ("fc00::1", "unique-local"),
            ("fd00::1", "unique-local"),
            ("fdff:ffff::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("feff::1", "site-local"),
            ("ff02::1", "multicast"),
            ("ff0e::1", "multicast"),
            ("2001::1", "teredo"),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"),
            ("2001:2::1", "protocol"),
            ("2001:20::1", "protocol"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("5f00::1", "not global"),
            ("4000::1", "not global"),
            ("1::1", "not global"),
        ];
        for (text, expected) in table {
            let address = ip(text);
            assert!(!is_public(address), "{text} must not be public");
            let class = class(address).unwrap().to_string();
            assert!(
                class.contains(expected),
                "{text}: {class:?} should mention {expected:?}"
            );
        }
    }

    #[test]
    fn public_addresses() {
        for text in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.0.3.1",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "203.0.112.255",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001:80b::200e",
            "2001:200::1",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:808:808::1",
            "3ffe::1",
            "3fff:1000::1",
        ] {
            assert!(is_public(ip(text)), "{text} must be public");
            assert_eq!(class(ip(text)), None);
        }
    }

    #[test]
    fn allow_rules_match_names_addresses_and_blocks() {
        let rules = AllowRules::compile(&[
            "Orders.Internal.".into(),
            "127.0.0.1".into(),
            "[::1]".into(),
            "10.1.0.0/16".into(),
            "fd00:1::/32".into(),
            " ".into(),
            "10.0.0.0/33".into(),
        ]);
        assert!(rules.allows_name("orders.internal"));
        assert!(!rules.allows_name("internal"));
        assert!(rules.allows_ip(ip("127.0.0.1")));
        assert!(
            rules.allows_ip(ip("::ffff:127.0.0.1")),
            "a mapped address is its IPv4 address"
        );
        assert!(!rules.allows_ip(ip("127.0.0.2")));
        assert!(rules.allows_ip(ip("::1")));
        assert!(rules.allows_ip(ip("10.1.200.3")));
        assert!(!rules.allows_ip(ip("10.2.0.1")));
        assert!(rules.allows_ip(ip("fd00:1:ffff::9")));
        assert!(!rules.allows_ip(ip("fd00:2::9")));
        assert_eq!(
            rules.names,
            vec!["orders.internal".to_string()],
            "a malformed block is not a name"
        );
        assert_eq!(rules.nets.len(), 4);
        let everything = AllowRules::compile(&["0.0.0.0/0".into()]);
        assert!(everything.allows_ip(ip("192.168.1.1")));
        assert!(!everything.allows_ip(ip("fd00::1")));
    }

    #[test]
    fn targets_parse_literals_and_names() {
        assert_eq!(Target::parse("[::1]"), Target::Ip(ip("::1")));
        assert_eq!(Target::parse("127.0.0.1"), Target::Ip(ip("127.0.0.1")));
        assert_eq!(Target::parse("127.0.0.1."), Target::Ip(ip("127.0.0.1")));
        assert_eq!(Target::parse("LocalHost."), Target::Name("localhost".into()));
        assert_eq!(Target::parse("example.com"), Target::Name("example.com".into()));
    }

    #[test]
    fn plans_without_resolution() {
        let guard = Guard::new(&["127.0.0.1".into(), "metadata.google.internal".into()], false);
        let plan = |https, host: &str| guard.plan(https, &Target::parse(host));
        assert_eq!(plan(false, "127.0.0.1"), Ok(Plan::Literal(ip("127.0.0.1"))));
        assert!(matches!(plan(true, "127.0.0.2"), Err(NetError::Refused(_))));
        assert!(matches!(plan(false, "8.8.8.8"), Err(NetError::Refused(m)) if m.contains("plain http")));
        assert_eq!(plan(true, "8.8.8.8"), Ok(Plan::Literal(ip("8.8.8.8"))));
        for name in [
            "localhost",
            "localhost.",
            "LOCALHOST",
            "api.localhost",
            "metadata.goog",
            "metadata",
        ] {
            assert!(matches!(plan(true, name), Err(NetError::Refused(_))), "{name}");
        }
        assert_eq!(
            plan(false, "metadata.google.internal"),
            Ok(Plan::Resolve {
                name: "metadata.google.internal".into(),
                name_allowed: true,
                plain_http: false
            })
        );
        assert_eq!(
            plan(false, "example.com"),
            Ok(Plan::Resolve {
                name: "example.com".into(),
                name_allowed: false,
                plain_http: true
            })
        );
        let open = Guard::new(&[], true);
        assert_eq!(
            open.plan(false, &Target::parse("8.8.8.8")),
            Ok(Plan::Literal(ip("8.8.8.8")))
        );
        assert!(matches!(
            open.plan(false, &Target::parse("10.0.0.1")),
            Err(NetError::Refused(_))
        ));
    }

    #[test]
    fn resolved_addresses_are_all_vetted() {
        let guard = Guard::new(&["10.1.0.0/16".into()], false);
        let public = ip("93.184.216.34");
        assert_eq!(guard.vet_resolved("a.test", false, false, &[public]), Ok(()));
        assert!(matches!(
            guard.vet_resolved("a.test", false, false, &[public, ip("10.0.0.7")]),
            Err(NetError::Refused(m)) if m.contains("10.0.0.7")
        ));
        assert_eq!(
            guard.vet_resolved("a.test", false, false, &[public, ip("10.1.2.3")]),
            Ok(())
        );
        assert_eq!(
            guard.vet_resolved("a.test", false, true, &[ip("10.1.2.3")]),
            Ok(())
        );
        assert!(matches!(
            guard.vet_resolved("a.test", false, true, &[public]),
            Err(NetError::Refused(m)) if m.contains("plain http")
        ));
        assert_eq!(
            guard.vet_resolved("a.test", true, true, &[ip("127.0.0.1")]),
            Ok(())
        );
        assert!(matches!(
            guard.vet_resolved("a.test", false, false, &[]),
            Err(NetError::Resolve(_))
        ));
    }
}
