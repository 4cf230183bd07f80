// Package pgbouncer starts a throwaway PgBouncer (the installed Debian
// package's binary) in front of a pgtest cluster, so that tests and
// benchmarks run the drain through a real connection pooler, as the pooled
// deployment does (Cloud SQL's Managed Connection Pooling in production).
// It serves tests and benchmarks, and is never deployed.
package pgbouncer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config configures a PgBouncer. The zero value is a session-mode pooler
// with PgBouncer's defaults.
type Config struct {
	// Bin is the pgbouncer binary. Default: $PGBOUNCER_BIN, else
	// /usr/sbin/pgbouncer, else pgbouncer on $PATH.
	Bin string
	// Server is the PostgreSQL server behind it (host and port); every
	// database name a client asks for is that database there.
	Server string
	// Users are the logins it accepts and makes to the server (name →
	// password).
	Users map[string]string
	// Settings are pgbouncer.ini settings (name → value) over the
	// defaults: pool_mode session, max_client_conn 10000.
	Settings map[string]string
}

// Server is a running PgBouncer.
type Server struct {
	addr    string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
}

// ErrNotInstalled: no pgbouncer binary was found.
var ErrNotInstalled = errors.New("pgbouncer: not installed (apt-get install pgbouncer, or set PGBOUNCER_BIN)")

// Binary finds the pgbouncer binary.
func Binary(cfg Config) (string, error) {
	for _, p := range []string{cfg.Bin, os.Getenv("PGBOUNCER_BIN"), "/usr/sbin/pgbouncer"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	return "", ErrNotInstalled
}

// Start starts a PgBouncer on a free loopback port and waits until it
// accepts connections. It runs as the postgres user when this process is
// root (PgBouncer refuses to run as root). Stop ends it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	bin, err := Binary(cfg)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(cfg.Server)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: Server %q: %w", cfg.Server, err)
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, exited: make(chan struct{}), logPath: filepath.Join(dir, "pgbouncer.log")}
	listen, err := freePort()
	if err != nil {
		return nil, err
	}
	s.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	var users strings.Builder
	for _, name := range slices.Sorted(maps.Keys(cfg.Users)) {
		fmt.Fprintf(&users, "%q %q\n", name, cfg.Users[name])
	}
	settings := map[string]string{
		"listen_addr": "127.0.0.1", "listen_port": strconv.Itoa(listen), "unix_socket_dir": "",
		"auth_type": "scram-sha-256", "auth_file": filepath.Join(dir, "userlist.txt"),
		"pool_mode": "session", "max_client_conn": "10000", "logfile": s.logPath,
		"pidfile": filepath.Join(dir, "pgbouncer.pid"), "log_connections": "0", "log_disconnections": "0",
	}
	maps.Copy(settings, cfg.Settings)
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = host=%s port=%s\n\n[pgbouncer]\n", host, port)
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&ini, "%s = %s\n", k, settings[k])
	}
	cred, err := credential(dir)
	if err != nil {
		return nil, err
	}
	for name, content := range map[string]string{"userlist.txt": users.String(), "pgbouncer.ini": ini.String()} {
		if err := writeOwned(filepath.Join(dir, name), content, cred); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer: start: %w", err)
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return s, nil
		}
		select {
		case <-s.exited:
			logText, _ := os.ReadFile(s.logPath)
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgbouncer: exited at start: %s %s", bytes.TrimSpace(out.Bytes()), bytes.TrimSpace(logText))
		case <-ctx.Done():
			_ = s.Stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = s.Stop()
			return nil, errors.New("pgbouncer: not accepting connections after 30 s")
		}
	}
}

// Addr is the pooler's host:port.
func (s *Server) Addr() string { return s.addr }

// URL is the connection URL of database through the pooler, as user.
func (s *Server) URL(user, password, database string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: s.addr, Path: "/" + database, RawQuery: "sslmode=disable"}
	return u.String()
}

// Log is what PgBouncer logged so far.
func (s *Server) Log() string {
	raw, _ := os.ReadFile(s.logPath)
	return string(raw)
}

// Stop ends PgBouncer (its client and server connections with it) and
// removes its files.
func (s *Server) Stop() error {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // immediate shutdown
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	return os.RemoveAll(s.dir)
}

// credential is the user PgBouncer runs as: this process's own, unless
// it is root: then the postgres user's, after handing it dir.
func credential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(cmp.Or(os.Getenv("PGBOUNCER_USER"), "postgres"))
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: running as root needs a postgres user to run PgBouncer as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

func writeOwned(path, content string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	if cred != nil {
		return os.Chown(path, int(cred.Uid), int(cred.Gid))
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
