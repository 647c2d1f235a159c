//! A history as a picture: one self-contained HTML page (inline CSS and
//! SVG, no scripts, nothing fetched) in the spirit of Jepsen's
//! `timeline.html`. One lane per broker and client process; operations as
//! bars from invocation to completion, coloured by outcome; faults shaded
//! from injection to heal over the lanes they hit; power cuts and node
//! failures as marks; the phases as lines. The violations are listed at
//! the top, and the operations they name (by record value) are outlined in
//! red. Hovering a bar shows its details (SVG `<title>`).

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::checkers::Violation;
use crate::history::{Event, EventKind};

/// Pixels of the time axis.
const WIDTH_PX: f64 = 1400.0;
/// Pixels of the lane labels' column.
const LABEL_PX: f64 = 110.0;
const LANE_PX: f64 = 22.0;
const AXIS_PX: f64 = 40.0;

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A bar on a lane.
struct Bar {
    lane: String,
    from_ms: u64,
    to_ms: u64,
    class: &'static str,
    title: String,
    /// Record values the operation carries (for highlighting).
    values: Vec<String>,
}

/// A shaded fault.
struct Shade {
    kind: String,
    detail: String,
    from_ms: u64,
    to_ms: u64,
    /// Lanes it hits; empty: every lane.
    lanes: Vec<String>,
}

/// The lane order: brokers, producers, consumers, then the rest, each by
/// number.
fn lane_key(lane: &str) -> (u8, u64, String) {
    let group = match lane.split('-').next().unwrap_or("") {
        "broker" => 0,
        "producer" => 1,
        "consumer" => 2,
        "faults" => 3,
        "operator" => 4,
        "hostile" => 4,
        _ => 5,
    };
    let number = lane.rsplit('-').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    (group, number, lane.to_string())
}

/// Lanes a fault's detail names ("broker 3", "brokers [1, 2]",
/// "consumer 0").
fn brokers_named(detail: &str) -> Vec<String> {
    if let Some(consumer) = detail.strip_prefix("consumer ") {
        return vec![format!("consumer-{consumer}")];
    }
    if !detail.starts_with("broker") {
        return Vec::new();
    }
    let first = detail.split(" dropped").next().unwrap_or(detail);
    let upto = first.find(" offset").or_else(|| first.find(" jumps")).unwrap_or(first.len());
    first[..upto]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .map(|n| format!("broker-{n}"))
        .collect()
}

/// Quoted words of the violations: the record values they name.
fn named_values(violations: &[Violation]) -> Vec<String> {
    let mut values = Vec::new();
    for violation in violations {
        let mut parts = violation.message.split('"');
        parts.next();
        while let (Some(quoted), _) = (parts.next(), parts.next()) {
            if !quoted.is_empty() {
                values.push(quoted.to_string());
            }
        }
    }
    values
}

/// The page for `events`, titled `title`, listing `violations`.
pub fn html(title: &str, events: &[Event], violations: &[Violation]) -> String {
    let end_ms = events.iter().map(|e| e.at_ms).max().unwrap_or(0).max(1);
    let mut bars = Vec::new();
    let mut shades: Vec<Shade> = Vec::new();
    let mut marks: Vec<(String, u64, &'static str, String)> = Vec::new();
    let mut phases = Vec::new();
    let mut open_ops: BTreeMap<u64, (String, u64, &'static str, String, Vec<String>)> = BTreeMap::new();
    let mut open_faults: Vec<(String, String, u64)> = Vec::new();
    let mut lanes: Vec<String> = Vec::new();
    let lane = |name: &str, lanes: &mut Vec<String>| {
        if !lanes.iter().any(|l| l == name) {
            lanes.push(name.to_string());
        }
    };
    for event in events {
        let at = event.at_ms;
        let process = event.process.as_str();
        match &event.kind {
            EventKind::Phase { name } => phases.push((at, name.clone())),
            EventKind::Fault { kind, detail } => {
                lane("faults", &mut lanes);
                open_faults.push((kind.clone(), detail.clone(), at));
                // Clock faults have no heal of their own: a mark.
                if kind.starts_with("clock") {
                    marks.push(("faults".into(), at, "clock", format!("{kind}: {detail}")));
                }
            }
            EventKind::Heal { kind, detail } => {
                if let Some(i) = open_faults.iter().position(|(k, d, _)| k == kind && d == detail) {
                    let (kind, detail, from_ms) = open_faults.remove(i);
                    shades.push(Shade { lanes: brokers_named(&detail), kind, detail, from_ms, to_ms: at });
                }
            }
            EventKind::ProduceInvoke { op, producer, topic, partition, values } => {
                lane(process, &mut lanes);
                let title = format!("produce op {op} by producer {producer} to {topic}/{partition}: {values:?}");
                open_ops.insert(*op, (process.to_string(), at, "produce", title, values.clone()));
            }
            EventKind::AckInvoke { op, member, generation, topic, partition, offset, hostile, .. } => {
                lane(process, &mut lanes);
                let kind = if *hostile { "hostile ack" } else { "ack" };
                let title =
                    format!("{kind} op {op} by {member} (generation {generation}) {topic}/{partition} offset {offset}");
                open_ops.insert(*op, (process.to_string(), at, "ack", title, Vec::new()));
            }
            EventKind::ProduceOk { .. }
            | EventKind::ProduceFail { .. }
            | EventKind::AckOk { .. }
            | EventKind::AckFenced { .. }
            | EventKind::AckFail { .. } => {
                // A completion closes its invocation's bar.
                let (op, class, outcome) = match &event.kind {
                    EventKind::ProduceOk { op, base_offset, count, duplicate, .. } => {
                        let dup = if *duplicate { " (duplicate)" } else { "" };
                        (op, "produce ok", format!("ok: {count} records at offset {base_offset}{dup}"))
                    }
                    EventKind::ProduceFail { op, error } => (op, "produce fail", format!("failed: {error}")),
                    EventKind::AckOk { op, position } => (op, "ack ok", format!("ok: position {position}")),
                    EventKind::AckFenced { op } => (op, "ack fenced", "fenced".to_string()),
                    EventKind::AckFail { op, error } => (op, "ack fail", format!("failed: {error}")),
                    _ => unreachable!("a completion"),
                };
                if let Some((lane, from, _, title, values)) = open_ops.remove(op) {
                    let title = format!("{title}\n{outcome}");
                    bars.push(Bar { lane, from_ms: from, to_ms: at, class, title, values });
                }
            }
            EventKind::PollOk { member, generation, topic, partition, invoked_at_ms, records, .. } => {
                lane(process, &mut lanes);
                let values: Vec<String> = records.iter().map(|r| r.value.clone()).collect();
                let offsets = match (records.first(), records.last()) {
                    (Some(a), Some(b)) => format!("offsets {}-{}", a.offset, b.offset),
                    _ => "no records (a claim)".to_string(),
                };
                let title =
                    format!("poll by {member} (generation {generation}) {topic}/{partition}: {offsets} {values:?}");
                bars.push(Bar {
                    lane: process.to_string(),
                    from_ms: *invoked_at_ms,
                    to_ms: at,
                    class: "poll",
                    title,
                    values,
                });
            }
            EventKind::PowerCut { broker, groups, lost } => {
                let name = format!("broker-{broker}");
                lane(&name, &mut lanes);
                let class = if lost.is_empty() { "cut" } else { "cut bad" };
                marks.push((name, at, class, format!("power cut: {groups} persisted marks checked; lost: {lost:?}")));
            }
            EventKind::Killed { broker, groups, lost } => {
                let name = format!("broker-{broker}");
                lane(&name, &mut lanes);
                let class = if lost.is_empty() { "cut" } else { "cut bad" };
                marks.push((name, at, class, format!("killed: {groups} persisted marks checked; lost: {lost:?}")));
            }
            EventKind::NodeFailure { broker, reason } => {
                let name = format!("broker-{broker}");
                lane(&name, &mut lanes);
                marks.push((name, at, "failure", format!("node failure: {reason}")));
            }
            EventKind::DiskLost { broker, reason } => {
                let name = format!("broker-{broker}");
                lane(&name, &mut lanes);
                marks.push((name, at, "failure", format!("disk lost: {reason}")));
            }
            EventKind::Failover { broker, group, leader, .. } => {
                lane("driver", &mut lanes);
                let (class, what) = match leader {
                    Some(id) => ("member", format!("{group} led by broker {id} after broker {broker} crashed")),
                    None => ("failure", format!("{group} has no leader after broker {broker} crashed")),
                };
                marks.push(("driver".into(), at, class, what));
            }
            EventKind::LivenessTimeout { missing } => {
                marks.push(("driver".into(), at, "failure", format!("liveness bound reached: {missing} unconsumed")));
                lane("driver", &mut lanes);
            }
            EventKind::Operator { op, detail, outcome } => {
                lane("operator", &mut lanes);
                let class =
                    if outcome.starts_with("ok") || outcome.starts_with("started") { "member" } else { "failure" };
                marks.push(("operator".into(), at, class, format!("{op} {detail}: {outcome}")));
            }
            EventKind::Hostile { attack, accepted } => {
                lane("hostile", &mut lanes);
                let class = if accepted.is_some() { "failure" } else { "clock" };
                marks.push((
                    "hostile".into(),
                    at,
                    class,
                    format!("{attack}: {}", accepted.as_deref().unwrap_or("refused")),
                ));
            }
            EventKind::ReplicaLog { broker, .. }
            | EventKind::Snapshots { broker, .. }
            | EventKind::LogCompacted { broker, .. } => {
                lane(&format!("broker-{broker}"), &mut lanes);
            }
            _ => {}
        }
    }
    // Operations still open at the end never completed.
    for (_, (lane, from, kind, title, values)) in open_ops {
        let class = if kind == "produce" { "produce open" } else { "ack open" };
        bars.push(Bar {
            lane,
            from_ms: from,
            to_ms: end_ms,
            class,
            title: format!("{title}\nnever completed"),
            values,
        });
    }
    for (kind, detail, from_ms) in open_faults {
        if !kind.starts_with("clock") {
            shades.push(Shade { lanes: brokers_named(&detail), kind, detail, from_ms, to_ms: end_ms });
        }
    }
    lanes.sort_by_key(|l| lane_key(l));
    let row = |name: &str| lanes.iter().position(|l| l == name).unwrap_or(0) as f64;
    let x = |ms: u64| LABEL_PX + ms as f64 / end_ms as f64 * WIDTH_PX;
    let height = AXIS_PX + lanes.len() as f64 * LANE_PX + 10.0;
    let named = named_values(violations);

    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" role="img" aria-label="timeline">"#,
        w = LABEL_PX + WIDTH_PX + 20.0
    );
    for (i, name) in lanes.iter().enumerate() {
        let y = AXIS_PX + i as f64 * LANE_PX;
        let _ = write!(
            svg,
            r#"<rect class="lane" x="{LABEL_PX}" y="{y}" width="{WIDTH_PX}" height="{LANE_PX}"/><text class="label" x="4" y="{ty}">{name}</text>"#,
            ty = y + LANE_PX * 0.7,
            name = escape(name)
        );
    }
    for shade in &shades {
        let (x0, x1) = (x(shade.from_ms), x(shade.to_ms).max(x(shade.from_ms) + 2.0));
        let title = format!("{} ({}-{} ms): {}", shade.kind, shade.from_ms, shade.to_ms, shade.detail);
        let rows: Vec<f64> =
            if shade.lanes.is_empty() { vec![row("faults")] } else { shade.lanes.iter().map(|l| row(l)).collect() };
        for r in rows {
            let _ = write!(
                svg,
                r#"<rect class="fault" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{LANE_PX}"><title>{t}</title></rect>"#,
                y = AXIS_PX + r * LANE_PX,
                w = x1 - x0,
                t = escape(&title)
            );
        }
    }
    for (i, (at, name)) in phases.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<line class="phase" x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{height}"/><text class="phase-label" x="{tx:.1}" y="{ty}">{name} {at} ms</text>"#,
            ty = if i % 2 == 0 { 10 } else { 20 },
            px = x(*at),
            top = AXIS_PX - 10.0,
            tx = x(*at) + 3.0,
            name = escape(name)
        );
    }
    let mut highlighted = 0;
    for bar in &bars {
        let hit = bar.values.iter().any(|v| named.contains(v));
        highlighted += usize::from(hit);
        let (x0, x1) = (x(bar.from_ms), x(bar.to_ms).max(x(bar.from_ms) + 2.0));
        let y = AXIS_PX + row(&bar.lane) * LANE_PX + 4.0;
        let _ = write!(
            svg,
            r#"<rect class="op {class}{hl}" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{h}"><title>{t}</title></rect>"#,
            class = bar.class,
            hl = if hit { " violation" } else { "" },
            w = x1 - x0,
            h = LANE_PX - 8.0,
            t = escape(&format!("{} ({}-{} ms)", bar.title, bar.from_ms, bar.to_ms))
        );
    }
    for (lane, at, class, title) in &marks {
        let y = AXIS_PX + row(lane) * LANE_PX;
        let px = x(*at);
        let _ = write!(
            svg,
            r#"<path class="mark {class}" d="M{a:.1},{y0:.1} L{b:.1},{y0:.1} L{px:.1},{y1:.1} Z"><title>{t}</title></path>"#,
            a = px - 5.0,
            b = px + 5.0,
            y0 = y + 2.0,
            y1 = y + LANE_PX - 4.0,
            t = escape(&format!("{title} ({at} ms)"))
        );
    }
    // The time axis: a tick every second-ish.
    let step = [100u64, 250, 500, 1_000, 2_000, 5_000, 10_000, 20_000]
        .into_iter()
        .find(|s| end_ms / s <= 40)
        .unwrap_or(50_000);
    let mut tick = 0;
    while tick <= end_ms {
        let _ = write!(
            svg,
            r#"<line class="tick" x1="{px:.1}" y1="{y0}" x2="{px:.1}" y2="{y1}"/><text class="tick-label" x="{px:.1}" y="{ty}">{s}s</text>"#,
            px = x(tick),
            y0 = AXIS_PX - 4.0,
            y1 = AXIS_PX,
            ty = AXIS_PX - 6.0,
            s = tick as f64 / 1000.0
        );
        tick += step;
    }
    svg.push_str("</svg>");

    let mut list = String::new();
    if violations.is_empty() {
        list.push_str(r#"<p class="ok">Every guarantee held.</p>"#);
    } else {
        list.push_str(r#"<ul class="violations">"#);
        for violation in violations {
            let _ = write!(
                list,
                "<li><b>{}</b>: {}</li>",
                escape(&violation.guarantee.to_string()),
                escape(&violation.message)
            );
        }
        let _ = write!(list, "</ul><p>{highlighted} operations named by the violations are outlined in red.</p>");
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; }}
.violations li {{ color: #a00; margin: 2px 0; }}
.ok {{ color: #070; }}
.legend span {{ display: inline-block; padding: 1px 6px; margin-right: 6px; border-radius: 3px; }}
svg {{ border: 1px solid #ccc; background: #fff; }}
.lane {{ fill: #fafafa; stroke: #eee; }}
.label {{ font-size: 12px; fill: #333; }}
.fault {{ fill: #f4b400; opacity: 0.25; }}
.phase {{ stroke: #555; stroke-dasharray: 4 3; }}
.phase-label, .tick-label {{ font-size: 10px; fill: #555; }}
.tick {{ stroke: #999; }}
.op {{ stroke: none; }}
.produce.ok {{ fill: #2e7d32; }} .produce.fail {{ fill: #c62828; }} .produce.open {{ fill: #ef9a9a; }}
.ack.ok {{ fill: #1565c0; }} .ack.fenced {{ fill: #ef6c00; }} .ack.fail {{ fill: #c62828; }} .ack.open {{ fill: #90caf9; }}
.poll {{ fill: #6a1b9a; opacity: 0.8; }}
.violation {{ stroke: #f00; stroke-width: 3; }}
.mark.member {{ fill: #00838f; }} .mark.cut {{ fill: #000; }} .mark.bad, .mark.failure {{ fill: #f00; }} .mark.clock {{ fill: #795548; }}
</style></head><body>
<h1>{title}</h1>
{list}
<p class="legend"><span style="background:#2e7d32;color:#fff">produce ok</span><span style="background:#c62828;color:#fff">failed</span><span style="background:#1565c0;color:#fff">ack ok</span><span style="background:#ef6c00;color:#fff">ack fenced</span><span style="background:#6a1b9a;color:#fff">poll</span><span style="background:#f4b40044">fault (injected to healed)</span><span>&#9660; power cut (black), failure (red), clock fault (brown)</span></p>
{svg}
</body></html>
"#,
        title = escape(title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkers::Guarantee;
    use crate::history::Seen;

    fn event(at_ms: u64, process: &str, kind: EventKind) -> Event {
        Event { at_ms, process: process.into(), kind }
    }

    #[test]
    fn the_page_draws_lanes_operations_faults_and_outlines_what_a_violation_names() {
        let events = vec![
            event(0, "driver", EventKind::Phase { name: "safety".into() }),
            event(
                10,
                "producer-0",
                EventKind::ProduceInvoke {
                    op: 1,
                    producer: 7,
                    topic: "t0".into(),
                    partition: 0,
                    values: vec!["p0-b0-r0".into()],
                },
            ),
            event(20, "faults", EventKind::Fault { kind: "crash".into(), detail: "broker 2".into() }),
            event(25, "broker-2", EventKind::PowerCut { broker: 2, groups: 3, lost: vec![] }),
            event(
                30,
                "producer-0",
                EventKind::ProduceOk {
                    op: 1,
                    base_offset: 0,
                    count: 1,
                    duplicate: false,
                    topic_id: 0,
                    partition: None,
                },
            ),
            event(
                40,
                "consumer-0",
                EventKind::PollOk {
                    group: "g".into(),
                    member: "c0-0".into(),
                    generation: 1,
                    topic: "t0".into(),
                    partition: 0,
                    invoked_at_ms: 35,
                    records: vec![Seen { offset: 0, value: "p0-b1-r0".into(), append_time_ms: 12 }],
                },
            ),
            event(90, "faults", EventKind::Heal { kind: "crash".into(), detail: "broker 2".into() }),
        ];
        let violations = vec![Violation {
            guarantee: Guarantee::G1,
            message: r#"acknowledged record "p0-b0-r0" at t0/0 offset 0 is not in the committed log"#.into(),
        }];
        let page = html("seed 7 <test>", &events, &violations);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("seed 7 &lt;test&gt;"), "the title is escaped");
        for lane in ["broker-2", "producer-0", "consumer-0", "faults"] {
            assert!(page.contains(&format!(">{lane}</text>")), "lane {lane}");
        }
        assert_eq!(page.matches(r#"class="op produce ok violation""#).count(), 1, "the named produce is outlined");
        assert_eq!(page.matches(r#"class="op poll""#).count(), 1, "the poll is drawn, not outlined");
        assert!(page.contains(r#"class="fault""#) && page.contains("crash (20-90 ms): broker 2"));
        assert!(page.contains(r#"class="mark cut""#));
        assert!(page.contains("G1 lost write"));
        assert!(!page.contains("<script"), "self-contained, no scripts");
    }

    #[test]
    fn fault_details_name_their_brokers() {
        assert_eq!(brokers_named("broker 3"), vec!["broker-3"]);
        assert_eq!(brokers_named("brokers [1, 4]"), vec!["broker-1", "broker-4"]);
        assert_eq!(brokers_named("broker 2 offset -300 ms, drift 10 ppm"), vec!["broker-2"]);
        assert_eq!(brokers_named("broker [1] -> broker [3] dropped"), vec!["broker-1", "broker-3"]);
        assert_eq!(brokers_named("consumer 2"), vec!["consumer-2"]);
        assert!(brokers_named("messages take 10-200 ms").is_empty());
    }
}
