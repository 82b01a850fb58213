//! `flash info`: geometry, header, and with a passphrase UBI's volumes and erase counters, as text or JSON.

use std::io::Write;
use std::path::PathBuf;

use sectorcrypt_ubi::media::VolType;
use sectorcrypt_ubi::{AttachOptions, Ubi};
use serde_json::{json, Value};

use crate::chip::require_chip;
use crate::exit::CliError;
use crate::keyfile::KeyArgs;

#[derive(clap::Args, Debug)]
pub(crate) struct InfoArgs {
    /// The flash (a NAND image file or /dev/mtdN).
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Also unlock it and show UBI (the passphrase from this file; '-' = standard input);
    /// attaching UBI may write, as the kernel's attach does.
    #[arg(short = 'd', long = "key-file", value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub(super) fn info(args: InfoArgs) -> Result<(), CliError> {
    // With a key UBI is attached, which may write as the kernel's attach does (erase PEBs left
    // unerased, grow a volume marked for auto-resize); without one nothing is written.
    let chip = require_chip(&args.device, args.key_file.is_none())?;
    let g = chip.flash().geometry();
    let mut out = json!({
        "device": args.device.display().to_string(),
        "geometry": {
            "peb_size": g.peb_size, "page_size": g.page_size, "sub_page_size": g.sub_page_size,
            "oob_size": g.oob_size, "peb_count": g.peb_count, "nop": g.nop,
        },
    });
    if let Some(counts) = chip.erase_counts() {
        out["chip_erase_counts"] = stats(counts.iter().map(|&c| u64::from(c)));
    }
    let header = match sectorcrypt_flashvol::read_header(chip.flash()) {
        Ok(h) => h,
        // A plain flash (UBI as ubiformat or flash import leaves it): the chip's facts only.
        Err(sectorcrypt_flashvol::Error::NotEncrypted(_)) if args.key_file.is_none() => {
            out["header"] = Value::Null;
            return print_info(&out, args.json);
        }
        Err(e) => return Err(e.into()),
    };
    let h = &header.header;
    let segment = h.data_segment()?;
    out["header"] = json!({
        "uuid": h.uuid(),
        "label": h.label(),
        "cipher": segment.cipher,
        "policy": header.params.policy.name(),
        "keyslots": h.metadata().keyslots.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "header_blocks": header.area.blocks(),
        "rewrite_journal_blocks": header.params.rewrite_journal().collect::<Vec<_>>(),
        "ubi_first_block": header.params.data_first,
        "conversion": header.params.conversion.map(|c| c.name()),
    });
    drop(header);
    if let Some(file) = &args.key_file {
        let key = KeyArgs {
            key_file: Some(file.clone()),
            ..KeyArgs::default()
        };
        let pass = key.read("")?;
        let opened = sectorcrypt_flashvol::unlock(chip.flash(), &pass, None)?;
        let ubi = opened.attach(&AttachOptions::default())?;
        out["ubi"] = ubi_json(&ubi);
        let crypt = opened.crypt.stats();
        out["encryption_layer"] =
            json!({"chip_erases": crypt.chip_erases, "rewrites": crypt.rewrites});
    }
    print_info(&out, args.json)
}

fn print_info(out: &Value, json: bool) -> Result<(), CliError> {
    let text = if json {
        format!("{out}\n")
    } else {
        info_text(out)
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|e| CliError::io("cannot write the output", e))
}

/// min / mean / max of `values`.
fn stats(values: impl Iterator<Item = u64>) -> Value {
    let v: Vec<u64> = values.collect();
    let (min, max) = (
        v.iter().min().copied().unwrap_or(0),
        v.iter().max().copied().unwrap_or(0),
    );
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<u64>() as f64 / v.len() as f64
    };
    json!({"min": min, "mean": mean, "max": max})
}

fn ubi_json(ubi: &Ubi) -> Value {
    let i = ubi.info();
    let (min, mean, max) = i.erase_counters;
    json!({
        "image_seq": i.image_seq,
        "leb_size": i.layout.leb_size,
        "pebs": i.pebs,
        "bad_pebs": i.bad_pebs,
        "corrupted_pebs": i.corrupted_pebs,
        "available_pebs": i.available_pebs,
        "reserved_for_bad": i.reserved_for_bad,
        "max_sqnum": i.max_sqnum,
        "erase_counters": {"min": min, "mean": mean, "max": max},
        "read_only": i.read_only,
        "volumes": i.volumes.iter().map(|v| json!({
            "id": v.id, "name": v.name,
            "type": match v.vol_type { VolType::Dynamic => "dynamic", VolType::Static => "static" },
            "lebs": v.lebs, "usable_leb_size": v.usable_leb_size, "alignment": v.alignment,
            "data_bytes": v.data_bytes, "mapped_lebs": v.mapped_lebs, "corrupted": v.corrupted,
        })).collect::<Vec<_>>(),
    })
}

/// The `info` report as text, from its JSON form (one source for both).
fn info_text(v: &Value) -> String {
    let g = &v["geometry"];
    let h = &v["header"];
    let mut s = format!(
        "Flash:       {}\nGeometry:    {} eraseblocks of {} bytes, pages of {}, sub-pages of {}, {} spare bytes, NOP {}\n",
        v["device"].as_str().unwrap_or(""),
        g["peb_count"], g["peb_size"], g["page_size"], g["sub_page_size"], g["oob_size"], g["nop"]
    );
    if let Some(c) = v.get("chip_erase_counts") {
        s += &format!(
            "Chip erases: min {} mean {:.2} max {} per eraseblock\n",
            c["min"],
            c["mean"].as_f64().unwrap_or(0.0),
            c["max"]
        );
    }
    if h.is_null() {
        return s + "Header:      none: a plain flash (sectorcrypt flash convert encrypts it in place)\n";
    }
    if let Some(stage) = h["conversion"].as_str() {
        s += &format!("Conversion:  in progress ({stage}): run flash convert again to finish it\n");
    }
    s += &format!(
        "Header:      LUKS2, UUID {}, cipher {}, erased space {}, keyslots {}\n             eraseblocks {}, UBI from eraseblock {}\n",
        h["uuid"].as_str().unwrap_or(""),
        h["cipher"].as_str().unwrap_or(""),
        h["policy"].as_str().unwrap_or(""),
        h["keyslots"],
        h["header_blocks"],
        h["ubi_first_block"]
    );
    if let Some(u) = v.get("ubi") {
        let ec = &u["erase_counters"];
        s += &format!(
            "UBI:         image sequence {:#x}, {} PEBs ({} bad, {} corrupted), LEBs of {} bytes, {} available, {} reserved for bad blocks\n             erase counters min {} mean {} max {}\n",
            u["image_seq"].as_u64().unwrap_or(0), u["pebs"], u["bad_pebs"], u["corrupted_pebs"],
            u["leb_size"], u["available_pebs"], u["reserved_for_bad"], ec["min"], ec["mean"], ec["max"]
        );
        for vol in u["volumes"].as_array().into_iter().flatten() {
            s += &format!(
                "Volume {}:    {:?} {} {} LEBs, {} bytes of data{}\n",
                vol["id"],
                vol["name"].as_str().unwrap_or(""),
                vol["type"].as_str().unwrap_or(""),
                vol["lebs"],
                vol["data_bytes"],
                if vol["corrupted"] == true {
                    " (corrupted)"
                } else {
                    ""
                }
            );
        }
    }
    s
}
