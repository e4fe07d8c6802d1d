//! The SQL and pg_hba text of a blue/green upgrade
//! (`controller::major_upgrade::blue_green_sql`) against real PostgreSQL
//! 15 (blue) and 18 (green), outside Kubernetes: the executor that will
//! send it through pods/exec does not exist yet (docs/major-upgrades.md,
//! "Blue/green"), so this proves the text itself with data — the scoped
//! plain-text rule lets only the upgrade's role in, the subscription
//! copies and streams every row, the freeze holds writes while green
//! confirms blue's last position, and green's sequences go on past blue's.

use pgfleet::config::catalog::PG18_WHEEL_BIN;
use pgfleet::controller::major_upgrade::blue_green_sql as bg;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PG15_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Blue listens on 5432 (the port the subscription names) on an address
/// of its own; green on a free port of 127.0.0.1.
const BLUE_IP: &str = "127.203.17.1";
const PASSWORD: &str = "bg-test-password";

fn run_as_postgres(argv: &[&str]) -> Result<String, String> {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .args(argv)
        .output()
        .map_err(|e| format!("runuser: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    match out.status.success() {
        true => Ok(text.trim().to_string()),
        false => Err(format!(
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

struct Pg {
    bin: &'static str,
    data: PathBuf,
    sock: PathBuf,
    port: u16,
}

impl Pg {
    fn init(dir: &Path, name: &str, bin: &'static str, port: u16, listen: &str) -> Pg {
        let data = dir.join(name);
        let initdb = format!("{bin}/initdb");
        let d = data.to_string_lossy().to_string();
        run_as_postgres(&[
            &initdb,
            "-D",
            &d,
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-data-checksums",
        ])
        .or_else(|_| run_as_postgres(&[&initdb, "-D", &d, "-U", "postgres", "-A", "trust"]))
        .unwrap();
        let conf = format!(
            "listen_addresses = '{listen}'\nport = {port}\nunix_socket_directories = '{}'\nwal_level = logical\n",
            dir.display()
        );
        let path = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(&conf);
        std::fs::write(&path, text).unwrap();
        Pg {
            bin,
            data,
            sock: dir.to_path_buf(),
            port,
        }
    }

    fn start(&self) {
        let log = self.data.with_extension("log");
        let (d, l) = (self.data.to_string_lossy(), log.to_string_lossy());
        run_as_postgres(&[
            &format!("{}/pg_ctl", self.bin),
            "-D",
            &d,
            "-l",
            &l,
            "-w",
            "start",
        ])
        .unwrap();
    }

    fn stop(&self) {
        let d = self.data.to_string_lossy();
        let _ = run_as_postgres(&[
            &format!("{}/pg_ctl", self.bin),
            "-D",
            &d,
            "-m",
            "fast",
            "-w",
            "stop",
        ]);
    }

    /// Each statement its own `-c` (ALTER SYSTEM refuses a transaction).
    fn sql(&self, db: &str, statements: &[&str]) -> Result<String, String> {
        let (psql, port, sock) = (
            format!("{}/psql", self.bin),
            self.port.to_string(),
            self.sock.to_string_lossy(),
        );
        let mut argv = vec![
            psql.as_str(),
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            &sock,
            "-p",
            &port,
        ];
        argv.extend(["-U", "postgres", "-d", db]);
        for s in statements {
            argv.extend(["-c", s]);
        }
        run_as_postgres(&argv)
    }

    fn one(&self, db: &str, sql: &str) -> String {
        self.sql(db, &[sql])
            .unwrap()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string()
    }
}

fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn blue_15_feeds_green_18_through_the_scoped_rule_and_the_switch_keeps_every_row() {
    let dir = crate::common::temp_dir("bg-sql");
    let owner = run_as_postgres(&["id", "-u"]).unwrap();
    std::os::unix::fs::chown(&dir, owner.parse().ok(), None).unwrap();
    let blue = Pg::init(&dir, "blue", PG15_BIN, 5432, BLUE_IP);
    let green = Pg::init(&dir, "green", PG18_WHEEL_BIN, free_port(), "127.0.0.1");
    // Blue as pgfleet renders it (plain-text TCP refused first), with the
    // upgrade's rule for green's address (a process here connects from
    // 127.0.0.1) before that line.
    let mut hba = String::from("local all all trust\n");
    for rule in bg::plain_text_rules(&["127.0.0.1".into()]).unwrap() {
        hba.push_str(&rule);
        hba.push('\n');
    }
    hba.push_str("hostnossl all all all reject\n");
    std::fs::write(blue.data.join("pg_hba.conf"), hba).unwrap();
    blue.start();
    green.start();
    let result = std::panic::catch_unwind(|| scenario(&dir, &blue, &green));
    blue.stop();
    green.stop();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn scenario(dir: &Path, blue: &Pg, green: &Pg) {
    let role = format!(
        "CREATE ROLE {} LOGIN REPLICATION PASSWORD '{PASSWORD}' IN ROLE pg_read_all_data",
        bg::ROLE
    );
    let schema = [
        role.as_str(),
        "CREATE TABLE orders (id bigserial PRIMARY KEY, note text)",
        "CREATE TABLE log (line text)",
        "CREATE SCHEMA \"we|ird\"",
        "CREATE SEQUENCE \"we|ird\".\"s\"\"q'x\"",
        "INSERT INTO orders (note) SELECT 'seed' FROM generate_series(1, 5000)",
        "SELECT setval('\"we|ird\".\"s\"\"q''x\"', 41)",
    ];
    blue.sql("postgres", &schema).unwrap();
    // Only the upgrade's role gets in without TLS.
    let tcp = |user: &str| {
        run_as_postgres(&[
            &format!("{PG15_BIN}/psql"),
            "-XAtq",
            &format!(
                "host={BLUE_IP} port=5432 dbname=postgres user={user} sslmode=disable password={PASSWORD}"
            ),
            "-c",
            "SELECT 1",
        ])
    };
    assert_eq!(tcp(bg::ROLE).as_deref(), Ok("1"));
    let refused = tcp("postgres").unwrap_err();
    assert!(refused.contains("pg_hba.conf rejects"), "{refused}");
    // Publication (twice: idempotent), schema, subscription.
    for _ in 0..2 {
        blue.sql("postgres", &[&bg::create_publication()]).unwrap();
    }
    let dump = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "runuser -u postgres -- {PG15_BIN}/pg_dump -h {s} -p 5432 -U postgres --schema-only --no-publications --no-subscriptions postgres \
             | runuser -u postgres -- {PG18_WHEEL_BIN}/psql -Xq -v ON_ERROR_STOP=0 -h {s} -p {p} -U postgres -d postgres",
            s = dir.display(),
            p = green.port
        ))
        .output()
        .unwrap();
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let passfile = dir.join("pgpass");
    std::fs::write(
        &passfile,
        format!("{BLUE_IP}:5432:*:{}:{PASSWORD}\n", bg::ROLE),
    )
    .unwrap();
    let owner: u32 = run_as_postgres(&["id", "-u"]).unwrap().parse().unwrap();
    std::os::unix::fs::chown(&passfile, Some(owner), None).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&passfile, std::fs::Permissions::from_mode(0o600)).unwrap();
    let source = bg::Source {
        host: BLUE_IP,
        database: "postgres",
        passfile: &passfile.to_string_lossy(),
        ca_file: "/nonexistent",
    };
    let create = bg::create_subscription(&source, bg::Transport::PlainTextScoped);
    if green.one("postgres", &bg::subscription_exists("postgres")) == "0" {
        green.sql("postgres", &[&create]).unwrap();
    }
    assert_eq!(
        green.one("postgres", &bg::subscription_exists("postgres")),
        "1"
    );
    eventually("green's initial copy", || {
        green
            .one("postgres", bg::GREEN_PROGRESS)
            .contains("\"syncing\" : 0")
    });
    // Guardrails as blue reports them.
    let progress: serde_json::Value =
        serde_json::from_str(&blue.one("postgres", bg::BLUE_PROGRESS)).unwrap();
    assert_eq!(progress["slots"], 1);
    assert_eq!(progress["noIdentity"], serde_json::json!(["public.log"]));
    // Writes go on; then the freeze: blue read-only, its last LSN.
    blue.sql(
        "postgres",
        &["INSERT INTO orders (note) SELECT 'live' FROM generate_series(1, 1000)"],
    )
    .unwrap();
    let frozen = blue.sql("postgres", &bg::FREEZE_BLUE).unwrap();
    let lsn = bg::lsn(frozen.lines().last().unwrap_or_default())
        .unwrap()
        .to_string();
    let refused = blue
        .sql("postgres", &["INSERT INTO orders (note) VALUES ('late')"])
        .unwrap_err();
    assert!(refused.contains("read-only transaction"), "{refused}");
    eventually("green to confirm blue's last position", || {
        blue.one("postgres", &bg::confirmed(bg::SLOT_PREFIX, &lsn, 1)) == "true"
    });
    // Sequences: green goes on past blue's values.
    let seqs = bg::parse_sequences(&blue.one("postgres", bg::SEQUENCES)).unwrap();
    green
        .sql("postgres", &[&bg::sync_sequences(&seqs)])
        .unwrap();
    green
        .sql("postgres", &[&bg::drop_subscription("postgres")])
        .unwrap();
    assert_eq!(
        blue.one("postgres", "SELECT count(*) FROM pg_replication_slots"),
        "0"
    );
    let blue_rows = blue.one("postgres", "SELECT count(*) || ' ' || max(id) FROM orders");
    assert_eq!(blue_rows, "6000 6000");
    assert_eq!(
        green.one("postgres", "SELECT count(*) || ' ' || max(id) FROM orders"),
        blue_rows
    );
    let next = green.one(
        "postgres",
        "INSERT INTO orders (note) VALUES ('green') RETURNING id",
    );
    assert_eq!(next, "6001");
    assert_eq!(
        green.one("postgres", "SELECT nextval('\"we|ird\".\"s\"\"q''x\"')"),
        "42"
    );
    // The switch undone instead: blue writable again.
    blue.sql("postgres", &bg::THAW_BLUE).unwrap();
    blue.sql("postgres", &["INSERT INTO orders (note) VALUES ('thawed')"])
        .unwrap();
    blue.sql("postgres", &[&bg::drop_publication()]).unwrap();
}
