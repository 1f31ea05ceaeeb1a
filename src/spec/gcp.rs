//! Google Cloud grammars and TPU facts: regions, zones, project ids, bucket and resource
//! names, TPU accelerator types and their chip counts. Pure functions returning
//! `Result<_, String>` where the string says what is expected; no IO.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Checks a region against GCP's grammar: `<area>-<direction><number>` such as `us-central1`,
/// `europe-west4`, `northamerica-northeast1`.
pub fn check_region(region: &str) -> Result<(), String> {
    let Some((area, rest)) = region.split_once('-') else {
        return Err("a region such as `us-central1` (area-direction followed by a number)".into());
    };
    let letters = rest.trim_end_matches(|c: char| c.is_ascii_digit());
    let digits = &rest[letters.len()..];
    let ok = !area.is_empty()
        && area.chars().all(|c| c.is_ascii_lowercase())
        && !letters.is_empty()
        && letters.chars().all(|c| c.is_ascii_lowercase())
        && !digits.is_empty()
        && digits.len() <= 2
        && !digits.starts_with('0');
    if ok {
        Ok(())
    } else {
        Err("a region such as `us-central1` (area-direction followed by a number)".into())
    }
}

/// Checks a zone (`<region>-<letter>`) and returns its region.
pub fn zone_region(zone: &str) -> Result<&str, String> {
    const EXPECTED: &str =
        "a zone such as `us-central2-b` (a region followed by `-` and one letter)";
    let Some((region, letter)) = zone.rsplit_once('-') else {
        return Err(EXPECTED.into());
    };
    if letter.len() != 1 || !letter.chars().all(|c| c.is_ascii_lowercase()) {
        return Err(EXPECTED.into());
    }
    check_region(region).map_err(|_| EXPECTED.to_owned())?;
    Ok(region)
}

/// The original's logical pool of a region: its name without the trailing number
/// (`us-central2` → `us-central`).
pub fn region_pool(region: &str) -> &str {
    region.trim_end_matches(|c: char| c.is_ascii_digit())
}

/// Checks a project id: 6–30 characters of lowercase letters, digits and hyphens, starting
/// with a letter, not ending with a hyphen; optionally behind a `domain:` prefix.
pub fn check_project(project: &str) -> Result<(), String> {
    const EXPECTED: &str = "a project id: 6 to 30 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen";
    let id = match project.rsplit_once(':') {
        Some((domain, id)) => {
            let domain_ok = !domain.is_empty()
                && domain
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
            if !domain_ok {
                return Err(EXPECTED.into());
            }
            id
        }
        None => project,
    };
    let ok = (6..=30).contains(&id.len())
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(()) } else { Err(EXPECTED.into()) }
}

/// Checks a bucket URI `gs://<bucket>` (a trailing `/` is accepted and dropped) and returns
/// the normalised URI. The bucket name follows Cloud Storage's naming rules.
pub fn normalize_bucket_uri(uri: &str) -> Result<String, String> {
    let trimmed = uri.trim();
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let Some(name) = trimmed.strip_prefix("gs://") else {
        return Err("a bucket URI such as `gs://my-bucket`".into());
    };
    if name.contains('/') {
        return Err("a bucket URI without an object path, such as `gs://my-bucket`".into());
    }
    check_bucket_name(name)?;
    Ok(format!("gs://{name}"))
}

/// Cloud Storage bucket naming rules.
pub fn check_bucket_name(name: &str) -> Result<(), String> {
    let max = if name.contains('.') { 222 } else { 63 };
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = (3..=max).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last())
        && name
            .split('.')
            .all(|part| !part.is_empty() && part.len() <= 63)
        && !name.starts_with("goog")
        && !name.contains("google");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a bucket name of 3 to {max} lowercase letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit, not containing `google`"
        ))
    }
}

/// Checks a TPU node id as the TPU API accepts it: starts with a lowercase letter, then
/// lowercase letters, digits or hyphens, not ending with a hyphen, at most 63 characters.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err("a TPU name: up to 63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen".into())
    }
}

/// Checks a Secret Manager secret id: 1–255 of `[A-Za-z0-9_-]`.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    let ok = (1..=255).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err("a Secret Manager secret id: 1 to 255 letters, digits, `_` or `-`".into())
    }
}

/// Families whose type names count TensorCores (two per chip) rather than chips.
const TENSORCORE_FAMILIES: &[&str] = &["v2", "v3", "v4", "v5p"];

/// A TPU accelerator type such as `v6e-16` or `v4-64`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TpuType {
    /// Interned: types are compared on every pass, and the families are few.
    family: super::Name,
    size: u32,
}

impl TpuType {
    /// Parses `<family>-<N>`: family `[a-z][a-z0-9]*`, N a positive integer without leading
    /// zero; for families that count TensorCores N must be even.
    pub fn parse(text: &str) -> Result<TpuType, String> {
        const EXPECTED: &str =
            "a TPU type such as `v6e-16`, `v5litepod-8` or `v4-64` (family, `-`, size)";
        let Some((family, size)) = text.rsplit_once('-') else {
            return Err(EXPECTED.into());
        };
        let family_ok = family.starts_with(|c: char| c.is_ascii_lowercase())
            && family
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let size_ok =
            !size.is_empty() && !size.starts_with('0') && size.chars().all(|c| c.is_ascii_digit());
        if !family_ok || !size_ok {
            return Err(EXPECTED.into());
        }
        let size: u32 = size
            .parse()
            .map_err(|_| format!("{EXPECTED}; the size is too large"))?;
        if TENSORCORE_FAMILIES.contains(&family) && !size.is_multiple_of(2) {
            return Err(format!(
                "an even size: `{family}` types count TensorCores, two per chip (e.g. `{family}-8` is 4 chips)"
            ));
        }
        Ok(TpuType {
            family: super::Name::new(family),
            size,
        })
    }

    /// The family as written (`v5litepod`).
    pub fn family(&self) -> &str {
        self.family.as_str()
    }

    /// The family as quota and reports name it (`v5litepod` is `v5e`).
    pub fn quota_family(&self) -> &str {
        if self.family == "v5litepod" {
            "v5e"
        } else {
            self.family.as_str()
        }
    }

    /// The number in the type name (chips or TensorCores, depending on the family).
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Chips in one slice of this type. v2, v3, v4 and v5p names count TensorCores (two per
    /// chip); the original halved only v4.
    pub fn chips(&self) -> u32 {
        if TENSORCORE_FAMILIES.contains(&self.family.as_str()) {
            self.size / 2
        } else {
            self.size
        }
    }
}

impl fmt::Display for TpuType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Piece by piece: types are written into every event and action that names one.
        f.write_str(self.family.as_str())?;
        f.write_str("-")?;
        f.write_str(itoa::Buffer::new().format(self.size))
    }
}

impl TpuType {
    /// Appends the type as `Display` writes it, without the formatting machinery (for
    /// texts written once per object seen to change).
    pub fn push_onto(&self, out: &mut String) {
        out.push_str(self.family.as_str());
        out.push('-');
        out.push_str(itoa::Buffer::new().format(self.size));
    }
}

impl Serialize for TpuType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TpuType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TpuType::parse(&text).map_err(|e| {
            serde::de::Error::custom(format!("invalid TPU type {text:?}: expected {e}"))
        })
    }
}

/// How a TPU is paid for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProvisioningModel {
    /// Spot capacity (preemptible, cheaper): what every job may take.
    Spot,
    /// On-demand capacity (never preempted, list price): taken by a job that waited
    /// `on_demand_after` for Spot.
    OnDemand,
    /// Capacity of a named reservation (paid whether used or not): taken by a job that
    /// waited `reserved_after` for Spot.
    Reserved,
}

impl ProvisioningModel {
    /// Every model, in the order a job may fall back through them.
    pub const ALL: [ProvisioningModel; 3] = [
        ProvisioningModel::Spot,
        ProvisioningModel::Reserved,
        ProvisioningModel::OnDemand,
    ];

    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProvisioningModel::Spot => "spot",
            ProvisioningModel::OnDemand => "on-demand",
            ProvisioningModel::Reserved => "reserved",
        }
    }

    /// The model written `text` (trimmed, any case).
    pub fn parse(text: &str) -> Option<ProvisioningModel> {
        let text = text.trim().to_lowercase();
        ProvisioningModel::ALL
            .into_iter()
            .find(|m| m.as_str() == text)
    }

    /// The model of an object the API describes as Spot or not, reserved or not.
    pub fn of(spot: bool, reserved: bool) -> ProvisioningModel {
        match (spot, reserved) {
            (true, _) => ProvisioningModel::Spot,
            (false, true) => ProvisioningModel::Reserved,
            (false, false) => ProvisioningModel::OnDemand,
        }
    }

    /// A bit of a [`ModelSet`].
    pub const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of provisioning models, as bits (`ProvisioningModel::bit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelSet(pub u8);

impl ModelSet {
    /// Spot only: what a job that has not waited may take.
    pub const SPOT: ModelSet = ModelSet(ProvisioningModel::Spot.bit());
    /// Every model.
    pub const ALL: ModelSet = ModelSet(0b111);

    /// True when `model` is in the set.
    pub fn has(self, model: ProvisioningModel) -> bool {
        self.0 & model.bit() != 0
    }

    /// The set with `model` added.
    pub fn with(self, model: ProvisioningModel) -> ModelSet {
        ModelSet(self.0 | model.bit())
    }
}

/// Checks a reservation name: 1–63 lowercase letters, digits or hyphens, starting with a
/// letter (the last segment of `projects/P/locations/Z/reservations/R`).
pub fn check_reservation_name(name: &str) -> Result<(), String> {
    check_node_name(name).map_err(|_| {
        "a reservation name: up to 63 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen".to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_pushed_onto_text_is_written_as_displayed() {
        for text in ["v6e-8", "v5litepod-16", "v4-64", "v5p-4096", "v2-8"] {
            let t = TpuType::parse(text).expect("valid");
            let mut out = String::from("type=");
            t.push_onto(&mut out);
            assert_eq!(out, format!("type={t}"));
            assert_eq!(t.to_string(), text);
        }
    }

    #[test]
    fn chip_arithmetic() {
        let chips = |t: &str| TpuType::parse(t).unwrap().chips();
        assert_eq!(chips("v4-8"), 4);
        assert_eq!(chips("v4-64"), 32);
        assert_eq!(chips("v5litepod-16"), 16);
        assert_eq!(chips("v5p-8"), 4);
        assert_eq!(chips("v2-8"), 4);
        assert_eq!(chips("v3-32"), 16);
        assert_eq!(chips("v6e-1"), 1);
        assert_eq!(
            TpuType::parse("v5litepod-16").unwrap().quota_family(),
            "v5e"
        );
        assert!(TpuType::parse("v4-7").is_err());
        assert!(TpuType::parse("v6e-016").is_err());
        assert!(TpuType::parse("V6e-16").is_err());
        assert!(TpuType::parse("v6e").is_err());
    }

    #[test]
    fn zones_and_regions() {
        assert_eq!(zone_region("us-central2-b"), Ok("us-central2"));
        assert_eq!(
            zone_region("northamerica-northeast1-a"),
            Ok("northamerica-northeast1")
        );
        assert!(zone_region("us-central2").is_err());
        assert!(zone_region("us-central-b").is_err());
        assert!(zone_region("us-central2-bb").is_err());
        assert!(check_region("europe-west4").is_ok());
        assert!(check_region("us-central-1").is_err());
        assert_eq!(region_pool("us-central2"), "us-central");
    }

    #[test]
    fn projects_and_buckets() {
        assert!(check_project("my-project-123").is_ok());
        assert!(check_project("example.com:my-project").is_ok());
        assert!(check_project("1project").is_err());
        assert!(check_project("short").is_err());
        assert!(check_project("My-Project").is_err());
        assert_eq!(normalize_bucket_uri("gs://b-1/").unwrap(), "gs://b-1");
        assert!(normalize_bucket_uri("gs://bucket/path").is_err());
        assert!(normalize_bucket_uri("s3://bucket").is_err());
        assert!(normalize_bucket_uri("gs://Bucket").is_err());
    }
}
