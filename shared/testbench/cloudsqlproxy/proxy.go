package cloudsqlproxy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
)

// serveProxy accepts the connector's connections until the listener closes.
func (i *Instance) serveProxy() {
	pool := x509.NewCertPool()
	pool.AddCert(i.caCert)
	cfg := &tls.Config{Certificates: []tls.Certificate{i.server}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS13}
	for {
		c, err := i.proxy.Accept()
		if err != nil {
			return
		}
		go i.serveConn(tls.Server(c, cfg))
	}
}

// serveConn is one connection: the TLS handshake (a client certificate of
// this instance's CA, unexpired), the PostgreSQL startup message, whose user
// must be the one the certificate was issued to, then the bytes both ways
// between the client and the server's Unix socket.
func (i *Instance) serveConn(client *tls.Conn) {
	if !i.track(client) {
		_ = client.Close()
		return
	}
	defer i.untrack(client)
	defer client.Close()
	if err := client.Handshake(); err != nil {
		return
	}
	certs := client.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return
	}
	user := certs[0].Subject.CommonName
	startup, err := readStartup(client)
	if err != nil {
		return
	}
	if code := binary.BigEndian.Uint32(startup[4:8]); code == 196608 { // protocol 3.0: a login, not a cancel request
		switch login := startupUser(startup); {
		case user == "":
			// A certificate of no IAM principal: the server asks for the
			// login's password, and an IAM user has none.
			_, _ = client.Write(fatal("28P01", fmt.Sprintf("password authentication failed for user %q", login)))
			return
		case login != user:
			_, _ = client.Write(fatal("28000", fmt.Sprintf("Cloud SQL IAM user authentication failed for user %q: the certificate is %q's", login, user)))
			return
		}
		i.mu.Lock()
		i.logins[user]++
		i.mu.Unlock()
	}
	server, err := net.Dial("unix", filepath.Join(i.cfg.SocketDir, ".s.PGSQL."+strconv.Itoa(i.cfg.Port)))
	if err != nil {
		_, _ = client.Write(fatal("08006", "the instance's server is not reachable"))
		return
	}
	if !i.track(server) {
		_ = server.Close()
		return
	}
	defer i.untrack(server)
	defer server.Close()
	if _, err := server.Write(startup); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(server, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
}

func (i *Instance) track(c net.Conn) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return false
	}
	i.conns[c] = true
	return true
}

func (i *Instance) untrack(c net.Conn) {
	i.mu.Lock()
	defer i.mu.Unlock()
	delete(i.conns, c)
}

// readStartup reads a startup-phase message: a length (itself included)
// and the rest.
func readStartup(r io.Reader) ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n < 8 || n > 10_000 {
		return nil, errors.New("not a startup message")
	}
	msg := make([]byte, n)
	copy(msg, head[:])
	_, err := io.ReadFull(r, msg[4:])
	return msg, err
}

// startupUser is a startup message's user parameter.
func startupUser(msg []byte) string {
	params := msg[8:]
	for len(params) > 0 {
		k, rest, ok := cut0(params)
		if !ok || k == "" {
			return ""
		}
		v, rest2, ok := cut0(rest)
		if !ok {
			return ""
		}
		if k == "user" {
			return v
		}
		params = rest2
	}
	return ""
}

func cut0(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return "", nil, false
}

// fatal is a PostgreSQL ErrorResponse of severity FATAL.
func fatal(code, message string) []byte {
	body := []byte{}
	for _, f := range []struct {
		tag byte
		v   string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', message}} {
		body = append(body, f.tag)
		body = append(body, f.v...)
		body = append(body, 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	return append(msg, body...)
}
