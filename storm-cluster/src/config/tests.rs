//! Tests of `config`, apart so that its own file stays short.

use super::*;

const SMALL: &str = r#"
        [cluster]
        name = "t"
        [mm]
        address = "127.0.0.1:7000"
        [[node]]
        name = "a"
        address = "127.0.0.1:7001"
        spool = "/tmp/a"
        [[node]]
        name = "b"
        address = "127.0.0.1:7002"
        spool = "/tmp/b"
        cpus = 4
    "#;

/// A cluster file whose one `[[node]]` table names `n` nodes.
pub(crate) fn hostlist_file(n: usize) -> String {
    format!(
        r#"
            [cluster]
            name = "big"
            [mm]
            address = "127.0.0.1:7000"
            [[node]]
            name = "node[00000-{:05}]"
            address = "127.0.0.1:0"
            spool = "/tmp/spool"
            cpus = 2
            "#,
        n - 1
    )
}

/// [`SMALL`] with a replicated MM of `n` replicas instead of `[mm]`.
fn group_file(n: usize) -> String {
    let mut text = SMALL.replace("[mm]\n        address = \"127.0.0.1:7000\"", "");
    for i in 0..n {
        text.push_str(&format!(
            "[[manager]]\nname = \"m{i}\"\naddress = \"127.0.0.1:{}\"\npeer_address = \
                 \"127.0.0.1:{}\"\ncontrol_socket = \"/run/m{i}.sock\"\n",
            7100 + i,
            7200 + i
        ));
    }
    text
}

/// [`SMALL`] with a peer `p` it may borrow from (`borrow`) and `guests` guest slot
/// tables after its nodes.
fn with_guests(borrow: bool, guests: &[(&str, &str, &str)]) -> String {
    let mut text = SMALL.to_string();
    text.push_str(&format!(
        "[federation]\nlisten = \"127.0.0.1:7100\"\n[[peer]]\nname = \"p\"\naddress = \
             \"127.0.0.1:7101\"\nkey_file = \"p.key\"\nmm_public_key_file = \"p-mm.pub\"\nborrow = \
             {borrow}\n"
    ));
    for (i, (name, cluster, node)) in guests.iter().enumerate() {
        text.push_str(&format!(
            "[[node]]\nname = \"{name}\"\naddress = \"127.0.0.1:{}\"\nspool = \
                 \"/tmp/{name}\"\nguest_of = {{ cluster = \"{cluster}\", node = \"{node}\" }}\n",
            7300 + i
        ));
    }
    text
}

/// Named features take bits from the bottom, lenders from the top: together they may not
/// meet (63 bits in all, the last being the own-node bit).
#[test]
fn named_features_and_lenders_share_the_63_bits() {
    let mut text = with_guests(true, &[("p-n0", "p", "n0")]);
    let names: Vec<String> = (0..62).map(|i| format!("\"f{i}\"")).collect();
    text = text.replacen(
        "[[node]]",
        &format!("[[node]]\nfeatures = [{}]", names.join(", ")),
        1,
    );
    ClusterConfig::parse(&text).expect("62 features and one lender fit");
    let names: Vec<String> = (0..63).map(|i| format!("\"f{i}\"")).collect();
    let text = with_guests(true, &[("p-n0", "p", "n0")]).replacen(
        "[[node]]",
        &format!("[[node]]\nfeatures = [{}]", names.join(", ")),
        1,
    );
    let e = ClusterConfig::parse(&text).unwrap_err().to_string();
    assert!(e.contains("1 lending clusters"), "{e}");
}

#[test]
fn guest_slots_need_their_lenders_mm_key_to_check_leases_with() {
    let text = with_guests(true, &[("p-n0", "p", "n0")])
        .replace("mm_public_key_file = \"p-mm.pub\"\n", "");
    let err = ClusterConfig::parse(&text).unwrap_err().to_string();
    assert!(err.contains("mm_public_key_file"), "{err}");
}

#[test]
fn guest_slots_stand_once_each_for_nodes_of_peers_the_cluster_may_borrow_from() {
    let c = ClusterConfig::parse(&with_guests(true, &[("p-n0", "p", "n0")])).unwrap();
    assert!(c.has_guest_slots());
    assert_eq!(c.home_node_count(), 2);
    assert_eq!(c.guest_slot("p", "n0"), Some(2));
    assert!(c.is_guest(2) && !c.is_guest(0));
    let masks = c.node_feature_masks();
    assert_eq!(
        masks[0] & OWN_NODE_BIT,
        OWN_NODE_BIT,
        "own nodes carry the bit"
    );
    assert_eq!(masks[2] & OWN_NODE_BIT, 0, "guest slots do not");
    assert_eq!(c.lenders(), ["p"]);
    assert_eq!(c.lender_bit("p"), OWN_NODE_BIT >> 1);
    assert_eq!(
        masks[2] & c.lender_bit("p"),
        c.lender_bit("p"),
        "a slot carries its lender's bit (--one-cluster)"
    );
    assert_eq!(masks[0] & c.lender_bit("p"), 0, "own nodes do not");
    assert_eq!(c.lender_bit("q"), 0, "no slot stands for q's nodes");
    assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
    // Files without guest slots give no node the bit: no job asks for it there.
    let plain = ClusterConfig::parse(SMALL).unwrap();
    assert!(
        plain
            .node_feature_masks()
            .iter()
            .all(|m| m & OWN_NODE_BIT == 0)
    );
    let e = ClusterConfig::parse(&with_guests(false, &[("p-n0", "p", "n0")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("may borrow"), "{e}");
    let e = ClusterConfig::parse(&with_guests(true, &[("x-n0", "x", "n0")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"x\""), "{e}");
    let twice = with_guests(true, &[("p-n0", "p", "n0"), ("again", "p", "n0")]);
    let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
    assert!(e.contains("already stands for node n0"), "{e}");
}

#[test]
fn a_replicated_mm_needs_no_mm_section_and_each_replica_sees_its_own_address() {
    let c = ClusterConfig::parse(&group_file(3)).unwrap();
    assert!(c.replicated());
    // The nodes dial the first replica until they find the leader.
    assert_eq!(c.mm.address.port(), 7100);
    assert_eq!(c.mm_addresses().len(), 3);
    let m1 = c.as_manager(c.manager_by_name("m1").unwrap());
    assert_eq!(m1.mm.address.port(), 7101);
    assert_eq!(m1.cluster.control_socket, PathBuf::from("/run/m1.sock"));
    assert_eq!(c.control_sockets().len(), 3);
    let e = c.manager_by_name("m9").unwrap_err();
    assert!(e.contains("m0, m1, m2"), "{e}");
    // The file written back reads the same.
    assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
}

#[test]
fn a_group_must_be_odd_distinct_on_tcp_and_a_single_mm_needs_its_address() {
    let e = ClusterConfig::parse(&group_file(2))
        .unwrap_err()
        .to_string();
    assert!(e.contains("odd count"), "{e}");
    let twice = group_file(3).replace("127.0.0.1:7201", "127.0.0.1:7100");
    let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
    assert!(e.contains("127.0.0.1:7100 is used twice"), "{e}");
    let ofi = group_file(3).replace("name = \"t\"", "name = \"t\"\nbackend = \"ofi\"");
    let e = ClusterConfig::parse(&ofi).unwrap_err().to_string();
    assert!(e.contains("need backend \"tcp\""), "{e}");
    let fast = format!(
        "{}[replication]\nheartbeat_ms = 10\nelection_timeout_ms = 20\n",
        group_file(3)
    );
    let e = ClusterConfig::parse(&fast).unwrap_err().to_string();
    assert!(e.contains("at least 4 heartbeats"), "{e}");
    let none = SMALL.replace("[mm]\n        address = \"127.0.0.1:7000\"", "");
    let e = ClusterConfig::parse(&none).unwrap_err().to_string();
    assert!(e.contains("no [mm] address"), "{e}");
}

#[test]
fn each_replica_may_have_a_relay_of_its_own_and_then_every_one_has() {
    // No relay anywhere, then the one [relay] address.
    assert!(
        ClusterConfig::parse(&group_file(3))
            .unwrap()
            .relay_addresses()
            .is_empty()
    );
    let one = format!("{}[relay]\naddress = \"127.0.0.1:7301\"\n", group_file(3));
    let c = ClusterConfig::parse(&one).unwrap();
    assert_eq!(c.relay_addresses(), ["127.0.0.1:7301".parse().unwrap()]);
    // One per replica, tried in the entries' order.
    let mut each = group_file(3);
    for i in 0..3 {
        each = each.replace(
            &format!("control_socket = \"/run/m{i}.sock\"\n"),
            &format!(
                "control_socket = \"/run/m{i}.sock\"\nrelay_address = \"127.0.0.1:{}\"\n",
                7400 + i
            ),
        );
    }
    let c = ClusterConfig::parse(&each).unwrap();
    let ports: Vec<u16> = c.relay_addresses().iter().map(|a| a.port()).collect();
    assert_eq!(ports, [7400, 7401, 7402]);
    assert_eq!(ClusterConfig::parse(&c.to_toml()).unwrap(), c);
    // All or none, never both kinds, never an address used twice.
    let partial = each.replace("relay_address = \"127.0.0.1:7401\"\n", "");
    let e = ClusterConfig::parse(&partial).unwrap_err().to_string();
    assert!(e.contains("manager \"m1\" has no relay_address"), "{e}");
    let both = format!("{each}[relay]\naddress = \"127.0.0.1:7301\"\n");
    let e = ClusterConfig::parse(&both).unwrap_err().to_string();
    assert!(e.contains("keep one"), "{e}");
    let twice = each.replace("127.0.0.1:7402", "127.0.0.1:7100");
    let e = ClusterConfig::parse(&twice).unwrap_err().to_string();
    assert!(e.contains("127.0.0.1:7100 is used twice"), "{e}");
}

#[test]
fn a_hostlist_table_names_one_node_per_name_in_order() {
    let c = ClusterConfig::parse(&hostlist_file(16_384)).unwrap();
    assert_eq!(c.node_count(), 16_384);
    assert_eq!(c.nodes[0].name, "node00000");
    assert_eq!(c.nodes[16_383].name, "node16383");
    assert_eq!(c.node_by_name("node00042"), Some(42));
    assert!(c.nodes.iter().all(|n| n.cpus == 2));

    let paired = SMALL.replace(
        "name = \"a\"\n        address = \"127.0.0.1:7001\"",
        "name = \"a[1-3]\"\n        address = \"127.0.0.[11-13]:7001\"",
    );
    let c = ClusterConfig::parse(&paired).unwrap();
    let got: Vec<_> = c
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.address.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            ("a1", "127.0.0.11:7001".to_string()),
            ("a2", "127.0.0.12:7001".to_string()),
            ("a3", "127.0.0.13:7001".to_string()),
            ("b", "127.0.0.1:7002".to_string()),
        ]
    );
}

#[test]
fn hostlist_mistakes_name_the_table() {
    let uneven = SMALL.replace(
        "name = \"a\"\n        address = \"127.0.0.1:7001\"",
        "name = \"a[1-3]\"\n        address = \"127.0.0.[11-12]:7001\"",
    );
    let e = ClusterConfig::parse(&uneven).unwrap_err().to_string();
    assert!(
        e.contains("stands for 3 nodes") && e.contains("2 addresses"),
        "{e}"
    );
    let shared_port = SMALL.replace("name = \"a\"", "name = \"a[1-2]\"");
    let e = ClusterConfig::parse(&shared_port).unwrap_err().to_string();
    assert!(e.contains("127.0.0.1:7001 is used twice"), "{e}");
    let backwards = SMALL.replace("name = \"a\"", "name = \"a[3-1]\"");
    let e = ClusterConfig::parse(&backwards).unwrap_err().to_string();
    assert!(e.contains("runs backwards"), "{e}");
}

#[test]
fn a_minimal_file_gets_defaults_and_a_directory() {
    let c = ClusterConfig::parse(SMALL).unwrap();
    assert_eq!(c.node_count(), 2);
    assert_eq!(c.mm_id(), 2);
    assert_eq!(c.nodes[0].cpus, 1);
    assert_eq!(c.nodes[1].cpus, 4);
    assert_eq!(c.timeslice(), Duration::from_millis(1));
    assert_eq!(c.directory()[2], Some("127.0.0.1:7000".parse().unwrap()));
    assert_eq!(c.node_by_name("b"), Some(1));
    let again = ClusterConfig::parse(&c.to_toml()).unwrap();
    assert_eq!(again, c, "round trip through TOML");
}

#[test]
fn counts_beyond_what_storm_supports_are_named_before_anything_is_sized() {
    // Found by fuzzing: 42949672954 transfers had the layout reserve 171 GB and abort.
    let huge = SMALL.replace("name = \"t\"", "name = \"t\"\nmax_transfers = 42949672954");
    let e = ClusterConfig::parse(&huge).unwrap_err().to_string();
    assert!(
        e.contains("max_transfers = 42949672954 is more than the 256"),
        "{e}"
    );
    let slots = SMALL.replace("name = \"t\"", "name = \"t\"\nheartbeat_slots = 100000");
    let e = ClusterConfig::parse(&slots).unwrap_err().to_string();
    assert!(e.contains("heartbeat_slots"), "{e}");
}

#[test]
fn mistakes_are_named() {
    let typo = SMALL.replace("name = \"t\"", "name = \"t\"\ntimeslise_ms = 2");
    let e = ClusterConfig::parse(&typo).unwrap_err().to_string();
    assert!(e.contains("timeslise_ms"), "{e}");
    let dup = SMALL.replace("name = \"b\"", "name = \"a\"");
    assert!(
        ClusterConfig::parse(&dup)
            .unwrap_err()
            .to_string()
            .contains("\"a\" appears twice")
    );
    let zero = SMALL.replace("name = \"t\"", "name = \"t\"\ntimeslice_ms = 0");
    assert!(
        ClusterConfig::parse(&zero)
            .unwrap_err()
            .to_string()
            .contains("timeslice_ms")
    );
    let none = "[mm]\naddress = \"127.0.0.1:1\"\n";
    assert!(
        ClusterConfig::parse(none)
            .unwrap_err()
            .to_string()
            .contains("no [[node]]")
    );
    let fan = SMALL.replace("[mm]", "[tcp]\nfanout = 0\n[mm]");
    assert!(
        ClusterConfig::parse(&fan)
            .unwrap_err()
            .to_string()
            .contains("fanout")
    );
    let e = ClusterConfig::load(Path::new("/nonexistent/storm.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/storm.toml"), "{e}");
}

/// A relative `[relay] socket` (and the key files) mean paths beside the cluster file, so one
/// file copied into each node's own directory names each node's own socket; an absolute one
/// stays as written.
#[test]
fn a_relative_relay_socket_is_beside_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.toml");
    let text = format!(
        "{SMALL}\n[relay]\naddress = \"127.0.0.1:7100\"\nsocket = \"relay/{{node}}.sock\"\n"
    );
    std::fs::write(&path, &text).unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    assert_eq!(cfg.relay.socket_of("a"), dir.path().join("relay/a.sock"));
    std::fs::write(
        &path,
        text.replace("relay/{node}.sock", "/run/x/{node}.sock"),
    )
    .unwrap();
    let cfg = ClusterConfig::load(&path).unwrap();
    assert_eq!(cfg.relay.socket_of("b"), Path::new("/run/x/b.sock"));
}
