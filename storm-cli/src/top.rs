//! `storm top`: a live view of the cluster in the terminal, refreshed from the MM every
//! `--interval-ms` (one second by default): how many nodes are up, busy, drained or down, the
//! jobs running and waiting, and a line per node with its state, jobs, CPU (with a bar),
//! load, memory in use, free spool space and the age of its sample (`STALE` once stale).
//!
//! Keys: `q` or Esc quits; `c`, `m` and `n` sort by CPU, memory in use or name; the arrows,
//! PgUp and PgDn scroll. The screen is drawn by [`render`] from a [`TopView`], so it is
//! tested on ratatui's test backend as well as in a real terminal (under tmux).

use std::time::{Duration, Instant};

use ratatui::Frame;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table};
use storm_cluster::control::{Client, JobInfo, JobState, NodeInfo, NodeState, Reply, Request};
use storm_cluster::size::human_bytes;

/// How the node lines are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Name,
    Cpu,
    Memory,
}

/// What one screen shows.
#[derive(Debug, Clone, Default)]
pub struct TopView {
    pub cluster: String,
    pub nodes: Vec<NodeInfo>,
    pub jobs: Vec<JobInfo>,
    pub sort: SortBy,
    /// The first node line shown.
    pub scroll: usize,
    /// Why the last refresh failed, if it did (the screen keeps the last answer).
    pub error: Option<String>,
}

impl TopView {
    /// The nodes in the order `sort` asks for.
    fn ordered(&self) -> Vec<&NodeInfo> {
        let mut v: Vec<&NodeInfo> = self.nodes.iter().collect();
        let cpu = |n: &NodeInfo| n.fresh_sample().map_or(-1.0, |s| s.cpu_util);
        let mem = |n: &NodeInfo| n.fresh_sample().map_or(0, |s| s.mem_total - s.mem_avail);
        match self.sort {
            SortBy::Name => {}
            SortBy::Cpu => v.sort_by(|a, b| cpu(b).total_cmp(&cpu(a))),
            SortBy::Memory => v.sort_by_key(|n| std::cmp::Reverse(mem(n))),
        }
        v
    }
}

/// A bar of `width` cells filled to `fraction`.
fn bar(fraction: f32, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f32).round() as usize).min(width);
    format!("{}{}", "█".repeat(filled), "·".repeat(width - filled))
}

/// Draws `view` on `frame`.
pub fn render(frame: &mut Frame, view: &TopView) {
    let [head, table, foot] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let count = |s: &[NodeState]| view.nodes.iter().filter(|n| s.contains(&n.state)).count();
    let running = view
        .jobs
        .iter()
        .filter(|j| matches!(j.state, JobState::Running | JobState::Suspended))
        .count();
    let queued = view
        .jobs
        .iter()
        .filter(|j| j.state == JobState::Queued)
        .count();
    let summary = Line::from(vec![
        Span::styled(
            format!("{} ", view.cluster),
            Style::default().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!(
            "nodes {}: {} idle, {} allocated, {} drained, {} lent, {} down or unresponsive   jobs: {} running, {} queued",
            view.nodes.len(),
            count(&[NodeState::Idle]),
            count(&[NodeState::Allocated]),
            count(&[NodeState::Drained, NodeState::Draining]),
            count(&[NodeState::Lent]),
            count(&[NodeState::Down, NodeState::Unresponsive, NodeState::Unknown]),
            running,
            queued
        )),
    ]);
    let mut lines = vec![summary];
    if let Some(e) = &view.error {
        lines.push(Line::styled(
            format!("MM unreachable, showing the last answer: {e}"),
            Style::default().fg(Color::Red),
        ));
    }
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" storm top ")),
        head,
    );
    let header = Row::new([
        "NAME",
        "STATE",
        "JOBS",
        "CPU%",
        "CPU",
        "LOAD",
        "MEM USED",
        "MEM",
        "SPOOL FREE",
        "SAMPLED",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let rows = view.ordered().into_iter().skip(view.scroll).map(|n| {
        let state = Span::styled(
            n.state.as_str(),
            match n.state {
                NodeState::Idle => Style::default().fg(Color::Green),
                NodeState::Allocated => Style::default().fg(Color::Cyan),
                NodeState::Down | NodeState::Unresponsive => Style::default().fg(Color::Red),
                _ => Style::default().fg(Color::Yellow),
            },
        );
        let age = n.records.as_ref().map_or(String::new(), |r| {
            format!(
                "{}{:.1} s ago",
                if r.stale { "STALE " } else { "" },
                r.age_ms as f64 / 1000.0
            )
        });
        match n.fresh_sample() {
            Some(s) => Row::new(vec![
                Span::raw(n.name.clone()),
                state,
                Span::raw(n.jobs.len().to_string()),
                Span::raw(format!("{:.1}", s.cpu_util * 100.0)),
                Span::raw(bar(s.cpu_util, 10)),
                Span::raw(format!("{:.2}", s.load[0])),
                Span::raw(human_bytes(s.mem_total - s.mem_avail)),
                Span::raw(human_bytes(s.mem_total)),
                Span::raw(human_bytes(s.spool_free)),
                Span::raw(age),
            ]),
            None => Row::new(vec![
                Span::raw(n.name.clone()),
                state,
                Span::raw(n.jobs.len().to_string()),
                Span::raw("-"),
                Span::raw(""),
                Span::raw("-"),
                Span::raw("-"),
                Span::raw("-"),
                Span::raw("-"),
                Span::styled(
                    if age.is_empty() {
                        "no sample".into()
                    } else {
                        age
                    },
                    Style::default().fg(Color::Yellow),
                ),
            ]),
        }
    });
    let widths = [
        Constraint::Min(10),
        Constraint::Length(12),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(16),
    ];
    frame.render_widget(Table::new(rows, widths).header(header), table);
    let sort = match view.sort {
        SortBy::Name => "name",
        SortBy::Cpu => "CPU",
        SortBy::Memory => "memory",
    };
    frame.render_widget(
        Paragraph::new(format!(
            " q quit   c/m/n sort by CPU, memory, name (now: {sort})   ↑↓ PgUp PgDn scroll"
        ))
        .style(Style::default().add_modifier(Modifier::REVERSED)),
        foot,
    );
}

/// The MM's answer for one screen.
fn fetch(client: &Client) -> Result<(Vec<NodeInfo>, Vec<JobInfo>), String> {
    let nodes = match client.call(&Request::Nodes)? {
        Reply::Nodes(n) => n,
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let jobs = match client.call(&Request::Queue)? {
        Reply::Queue(j) => j,
        Reply::Error(e) => return Err(e),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    Ok((nodes, jobs))
}

/// Runs the live view until the user quits; `connect` opens a connection to the MM.
pub fn run(
    cluster: String,
    connect: impl Fn() -> Result<Client, String>,
    interval: Duration,
) -> Result<(), String> {
    let mut view = TopView {
        cluster,
        ..TopView::default()
    };
    let mut terminal = ratatui::try_init().map_err(|e| format!("the terminal: {e}"))?;
    let result = (|| -> Result<(), String> {
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                match connect().and_then(|c| fetch(&c)) {
                    Ok((nodes, jobs)) => {
                        view.nodes = nodes;
                        view.jobs = jobs;
                        view.error = None;
                    }
                    Err(e) => view.error = Some(e),
                }
                next = Instant::now() + interval;
            }
            terminal
                .draw(|f| render(f, &view))
                .map_err(|e| format!("drawing: {e}"))?;
            let wait = next.saturating_duration_since(Instant::now());
            if !event::poll(wait).map_err(|e| format!("the terminal: {e}"))? {
                continue;
            }
            let Event::Key(key) = event::read().map_err(|e| format!("the terminal: {e}"))? else {
                continue;
            };
            if key.kind != KeyEventKind::Press {
                continue;
            }
            let page = terminal
                .size()
                .map_or(10, |s| s.height.saturating_sub(6) as usize);
            match key.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('c') => view.sort = SortBy::Cpu,
                KeyCode::Char('m') => view.sort = SortBy::Memory,
                KeyCode::Char('n') => view.sort = SortBy::Name,
                KeyCode::Down => view.scroll = (view.scroll + 1).min(view.nodes.len()),
                KeyCode::Up => view.scroll = view.scroll.saturating_sub(1),
                KeyCode::PageDown => view.scroll = (view.scroll + page).min(view.nodes.len()),
                KeyCode::PageUp => view.scroll = view.scroll.saturating_sub(page),
                _ => {}
            }
        }
    })();
    ratatui::restore();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use storm_cluster::sample::{NodeRecords, NodeSample};

    fn node(id: u32, state: NodeState, cpu: Option<f32>) -> NodeInfo {
        NodeInfo {
            id,
            name: format!("node{id}"),
            state,
            jobs: vec![],
            reason: None,
            records: Some(NodeRecords {
                sample: Some(NodeSample {
                    seq: 3,
                    cpu_util: cpu.unwrap_or(0.0),
                    mem_total: 8 << 30,
                    mem_avail: 6 << 30,
                    spool_free: 40 << 30,
                    ..Default::default()
                }),
                stale: cpu.is_none(),
                age_ms: if cpu.is_none() { 9_000 } else { 400 },
                ..Default::default()
            }),
        }
    }

    fn screen(view: &TopView) -> String {
        let mut t = Terminal::new(TestBackend::new(120, 12)).unwrap();
        t.draw(|f| render(f, view)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn the_screen_shows_each_node_its_cpu_and_the_stale_ones() {
        let view = TopView {
            cluster: "c1".into(),
            nodes: vec![
                node(0, NodeState::Idle, Some(0.05)),
                node(1, NodeState::Allocated, Some(0.97)),
                node(2, NodeState::Unresponsive, None),
            ],
            sort: SortBy::Cpu,
            ..TopView::default()
        };
        let s = screen(&view);
        assert!(
            s.contains("nodes 3: 1 idle, 1 allocated, 0 drained, 0 lent, 1 down"),
            "{s}"
        );
        let line = |name: &str| s.lines().position(|l| l.contains(name)).unwrap();
        assert!(line("node1") < line("node0"), "sorted by CPU:\n{s}");
        let busy = s.lines().find(|l| l.contains("node1")).unwrap();
        assert!(
            busy.contains("97.0") && busy.contains("██████████"),
            "{busy}"
        );
        assert!(busy.contains("2 GiB"), "memory in use: {busy}");
        let stale = s.lines().find(|l| l.contains("node2")).unwrap();
        assert!(stale.contains("STALE 9.0 s ago"), "{stale}");
    }
}
