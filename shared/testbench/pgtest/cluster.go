package pgtest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Config configures a throwaway cluster. The zero value is ready to use.
type Config struct {
	// BinDir holds initdb and postgres. Default: $PG_BIN, else the newest
	// /usr/lib/postgresql/*/bin, else the directory of initdb on $PATH.
	BinDir string
	// Settings are extra server settings (name → value), added to the
	// defaults that favour speed over durability (fsync off and so on).
	Settings map[string]string
	// Disposable: the test that starts the cluster stops it when it ends,
	// so the databases NewDatabase makes on it are not dropped one by one
	// (every DROP DATABASE forces a checkpoint: 200 of them took minutes on
	// a busy machine). Ignored on $DATABASE_URL's server, which stays.
	Disposable bool
}

// Cluster is a PostgreSQL server for tests and the local mode: either a
// throwaway one this process started (and Stop removes), or the server of
// $DATABASE_URL, on which it only creates and drops databases.
type Cluster struct {
	admin   *url.URL // the maintenance database, as a superuser
	dir     string   // data directory of an owned cluster, "" otherwise
	process *exec.Cmd
	exited  chan struct{}
	// templates are the template databases built on this cluster, by name.
	templates sync.Map
	// disposable: an owned cluster its test stops (Config.Disposable).
	disposable bool
	// restart starts an owned cluster's server again on its port (Restart).
	restart func(ctx context.Context) (*Cluster, error)
	mu      sync.Mutex // guards process, exited and restarts across a Restart
	// restarts counts the servers Restart started again.
	restarts int
}

// Start returns a cluster: $DATABASE_URL's server when that is set, otherwise
// a new throwaway cluster (initdb in a temporary directory, a free loopback
// port, run as the postgres user when this process is root, since PostgreSQL
// refuses to run as root). The throwaway server is killed if this process
// dies, and Stop removes it.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if raw := os.Getenv("DATABASE_URL"); raw != "" {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("pgtest: DATABASE_URL: %w", err)
		}
		c := &Cluster{admin: u}
		if err := c.ping(ctx, 10*time.Second); err != nil {
			return nil, fmt.Errorf("pgtest: DATABASE_URL server is not reachable: %w", err)
		}
		return c, nil
	}
	c, err := startOwned(ctx, cfg)
	if err == nil {
		c.disposable = cfg.Disposable
	}
	return c, err
}

func findBinDir(cfg Config) (string, error) {
	for _, dir := range []string{cfg.BinDir, os.Getenv("PG_BIN")} {
		if dir != "" {
			return dir, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	slices.SortFunc(found, func(a, b string) int { return cmp.Compare(version(b), version(a)) })
	if len(found) > 0 {
		return filepath.Dir(found[0]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgtest: no PostgreSQL server binaries (initdb) found: install PostgreSQL 15 or later (apt-get install postgresql), set PG_BIN to its bin directory, or set DATABASE_URL")
}

// version extracts the major version from /usr/lib/postgresql/<v>/bin/initdb.
func version(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

func startOwned(ctx context.Context, cfg Config) (c *Cluster, err error) {
	bin, err := findBinDir(cfg)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: create data directory: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	cred, err := serverCredential(dir)
	if err != nil {
		return nil, err
	}
	// The superuser needs a password over TCP (a random one, in the admin
	// URL only): any local user may reach 127.0.0.1. The Unix socket,
	// trusted, is in dir, which only the server's user may enter (0700).
	password := rand.Text()
	pwfile := filepath.Join(dir, "pwfile")
	if err := writeOwned(pwfile, password+"\n", cred); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth-local=trust", "--auth-host=scram-sha-256", "--pwfile="+pwfile, "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := initdb.CombinedOutput()
	_ = os.Remove(pwfile)
	if err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	settings := map[string]string{
		"listen_addresses":          "127.0.0.1",
		"unix_socket_directories":   dir,
		"fsync":                     "off",
		"synchronous_commit":        "off",
		"full_page_writes":          "off",
		"max_connections":           "200",
		"shared_buffers":            "256MB",
		"max_wal_size":              "4GB",
		"checkpoint_timeout":        "30min",
		"log_min_messages":          "warning",
		"deadlock_timeout":          "200ms",
		"max_locks_per_transaction": "256",
	}
	for k, v := range cfg.Settings {
		settings[k] = v
	}
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		c, err := launch(ctx, bin, dir, data, port, password, settings, cred)
		if err == nil {
			c.restart = func(ctx context.Context) (*Cluster, error) {
				return launch(ctx, bin, dir, data, port, password, settings, cred)
			}
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func launch(ctx context.Context, bin, dir, data string, port int, password string, settings map[string]string, cred *syscall.Credential) (*Cluster, error) {
	args := []string{"-D", data, "-p", strconv.Itoa(port)}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, fmt.Errorf("pgtest: server log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// SIGQUIT is an immediate shutdown; Go sets the death signal after the
	// credentials, so it survives the switch to the postgres user.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: start postgres: %w", err)
	}
	c := &Cluster{
		admin:   &url.URL{Scheme: "postgres", User: url.UserPassword("postgres", password), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres", RawQuery: "sslmode=disable"},
		dir:     dir,
		process: cmd,
		exited:  make(chan struct{}),
	}
	go func() { _ = cmd.Wait(); close(c.exited) }()
	if err := c.ping(ctx, 60*time.Second); err != nil {
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		<-c.exited
		logText, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("pgtest: postgres did not start on port %d: %w: %s", port, err, lastLines(string(logText), 5))
	}
	return c, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// serverCredential returns the credential the server runs as: nil (this
// process's own) unless this process is root, in which case the postgres
// user's, after handing it the data directory.
func serverCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root needs a postgres user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("pgtest: hand %s to the postgres user: %w", dir, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// writeOwned writes a file only its owner may read, owned by the server's
// user when cred names one.
func writeOwned(path, content string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("pgtest: write %s: %w", path, err)
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: hand %s to the postgres user: %w", path, err)
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) ping(ctx context.Context, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		conn, err := pgx.Connect(ctx, c.admin.String())
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-c.exited:
			return errors.New("the server exited")
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// URL returns the connection URL of the named database on this cluster.
func (c *Cluster) URL(database string) string {
	u := *c.admin
	u.Path = "/" + database
	return u.String()
}

// SocketDir is the directory of a throwaway cluster's trusted Unix socket
// ("" for a $DATABASE_URL cluster), and Port its port: a Cloud SQL
// stand-in forwards logins there.
func (c *Cluster) SocketDir() string { return c.dir }

// Port is the server's port.
func (c *Cluster) Port() int {
	port, _ := strconv.Atoi(c.admin.Port())
	return port
}

// AdminURL returns the URL of the maintenance database.
func (c *Cluster) AdminURL() string { return c.admin.String() }

// Exec runs SQL statements in the maintenance database.
func (c *Cluster) Exec(ctx context.Context, statements ...string) error {
	conn, err := pgx.Connect(ctx, c.admin.String())
	if err != nil {
		return fmt.Errorf("pgtest: connect: %w", err)
	}
	defer conn.Close(ctx)
	for _, s := range statements {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("pgtest: %s: %w", s, err)
		}
	}
	return nil
}

// CreateDatabase creates a database, as a copy of template when it is not
// empty, and returns its URL.
func (c *Cluster) CreateDatabase(ctx context.Context, name, template string) (string, error) {
	stmt := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if template != "" {
		stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	if err := c.Exec(ctx, stmt); err != nil {
		return "", err
	}
	return c.URL(name), nil
}

// DropDatabase drops a database, closing its connections.
func (c *Cluster) DropDatabase(ctx context.Context, name string) error {
	return c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Stop shuts a throwaway cluster down and removes its files; on a
// $DATABASE_URL cluster it drops the template databases it built.
func (c *Cluster) Stop() error {
	if c.process == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c.dropTemplates(ctx)
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopServerLocked()
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("pgtest: remove %s: %w", c.dir, err)
	}
	return nil
}
