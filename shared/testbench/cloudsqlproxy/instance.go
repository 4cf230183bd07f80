// Package cloudsqlproxy is a local stand-in for a Cloud SQL instance as
// the Go connector (cloud.google.com/go/cloudsqlconn) reaches one, so that
// the product's Cloud SQL path is dialled for real in tests and in the
// local mode (go run ./job/local --cloud-sql): the two Admin API calls the
// connector makes (the instance's connect settings, and the signing of an
// ephemeral client certificate, in exchange for an IAM access token), a CA
// and a server certificate for the instance, and the instance's server
// proxy, which takes TLS with the client's ephemeral certificate, checks
// that the login is the user the certificate was issued to, and forwards
// the connection to a PostgreSQL server's trusted Unix socket. The
// connector reaches it with its own options (DialerOptions): the Admin API
// endpoint, a dial function (the server proxy's port is fixed at 3307, so
// every address the settings give is dialled to this proxy's loopback
// listener instead) and token sources. It is never deployed.
//
// Faults, for the tests: the Admin API down (SetAdminDown), refusing every
// access token (SetTokensRefused), a restart of the instance (Restart:
// every proxied connection dropped), and short-lived certificates
// (Config.CertLifetime) for a refresh that meets them later.
package cloudsqlproxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/cloudsqlconn"
	"golang.org/x/oauth2"
)

// Config describes the instance.
type Config struct {
	// ConnName is the instance connection name, project:region:instance.
	ConnName string
	// SocketDir and Port are the PostgreSQL server's Unix socket, whose
	// logins are trusted: the proxy forwards a connection once the
	// certificate says who logs in.
	SocketDir string
	Port      int
	// Users maps each IAM access token the instance accepts to the IAM
	// database user it logs in as (a service account's email without
	// .gserviceaccount.com), a role of the PostgreSQL server.
	Users map[string]string
	// CertLifetime is how long an ephemeral certificate is valid (default:
	// an hour, as Cloud SQL's). Under the connector's refresh buffer (4
	// minutes) every new connection refreshes it.
	CertLifetime time.Duration
	// PublicOnly gives the instance no private IP.
	PublicOnly bool
}

// Addresses the connect settings give: documentation addresses
// (TEST-NET-1), which DialerOptions' dial function maps to the proxy's
// loopback listener; nothing is ever sent to them.
const (
	PublicIP  = "192.0.2.10"
	PrivateIP = "192.0.2.20"
)

// Instance is a running stand-in.
type Instance struct {
	cfg     Config
	project string
	region  string
	name    string

	caKey  *ecdsa.PrivateKey
	caCert *x509.Certificate
	caPEM  string
	server tls.Certificate

	admin *httptest.Server
	proxy net.Listener

	adminDown, tokensRefused atomic.Bool
	certs                    atomic.Int64
	mu                       sync.Mutex
	conns                    map[net.Conn]bool
	dialed                   []string       // the addresses the connector dialled
	logins                   map[string]int // the logins forwarded, by user
	closed                   bool
}

// Start starts the instance's Admin API and server proxy on loopback.
func Start(cfg Config) (*Instance, error) {
	parts := strings.Split(cfg.ConnName, ":")
	if len(parts) != 3 {
		return nil, fmt.Errorf("cloudsqlproxy: %q is not project:region:instance", cfg.ConnName)
	}
	if cfg.CertLifetime == 0 {
		cfg.CertLifetime = time.Hour
	}
	i := &Instance{cfg: cfg, project: parts[0], region: parts[1], name: parts[2], conns: map[net.Conn]bool{}, logins: map[string]int{}}
	if err := i.makeCA(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cloudsqlproxy: listen: %w", err)
	}
	i.proxy = ln
	go i.serveProxy()
	i.admin = httptest.NewServer(http.HandlerFunc(i.serveAdmin))
	return i, nil
}

// Close stops the instance.
func (i *Instance) Close() {
	i.mu.Lock()
	i.closed = true
	i.mu.Unlock()
	_ = i.proxy.Close()
	i.admin.Close()
	i.dropAll()
}

// AdminURL is the Admin API's base URL.
func (i *Instance) AdminURL() string { return i.admin.URL + "/" }

// SetAdminDown makes the Admin API answer 503 to everything (down), or
// serve again.
func (i *Instance) SetAdminDown(down bool) { i.adminDown.Store(down) }

// SetTokensRefused makes the Admin API refuse every access token (401), as
// for an account without the Cloud SQL Instance User role, or accept them
// again.
func (i *Instance) SetTokensRefused(refused bool) { i.tokensRefused.Store(refused) }

// Certificates counts the ephemeral certificates issued.
func (i *Instance) Certificates() int64 { return i.certs.Load() }

// Dialled returns the addresses the connector dialled (PublicIP or
// PrivateIP, and the port 3307).
func (i *Instance) Dialled() []string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]string(nil), i.dialed...)
}

// Logins counts the logins the proxy forwarded to the server, by IAM
// database user.
func (i *Instance) Logins() map[string]int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return maps.Clone(i.logins)
}

// Restart drops every connection through the proxy, as an instance
// restart does; new ones are taken at once.
func (i *Instance) Restart() int { return i.dropAll() }

func (i *Instance) dropAll() int {
	i.mu.Lock()
	conns := make([]net.Conn, 0, len(i.conns))
	for c := range i.conns {
		conns = append(conns, c)
	}
	i.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
	return len(conns)
}

// DialerOptions are the connector's options that reach this instance:
// its Admin API, the dial to its proxy, and token sources (the Admin API's
// token, and loginToken for the IAM login).
func (i *Instance) DialerOptions(loginToken string) []cloudsqlconn.Option {
	static := oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "admin-api", Expiry: time.Now().Add(24 * time.Hour)})
	login := oauth2.StaticTokenSource(&oauth2.Token{AccessToken: loginToken, Expiry: time.Now().Add(24 * time.Hour)})
	return []cloudsqlconn.Option{
		cloudsqlconn.WithAdminAPIEndpoint(i.AdminURL()),
		// The connector's metrics go to Cloud Monitoring, which no test
		// may reach.
		cloudsqlconn.WithBuiltInMetrics(false),
		cloudsqlconn.WithIAMAuthNTokenSources(static, login),
		cloudsqlconn.WithDialFunc(func(ctx context.Context, network, addr string) (net.Conn, error) {
			i.mu.Lock()
			i.dialed = append(i.dialed, addr)
			i.mu.Unlock()
			host, port, err := net.SplitHostPort(addr)
			if err != nil || port != "3307" || (host != PublicIP && host != PrivateIP) {
				return nil, fmt.Errorf("cloudsqlproxy: the connector dialled %q, not the instance's server proxy", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", i.proxy.Addr().String())
		}),
	}
}

// makeCA makes the instance's CA and its server certificate, whose CN is
// project:instance (what the connector checks of an instance without a DNS
// name).
func (i *Instance) makeCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Cloud SQL stand-in CA " + i.cfg.ConnName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	i.caKey = key
	if i.caCert, err = x509.ParseCertificate(der); err != nil {
		return err
	}
	i.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: i.project + ":" + i.name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, i.caCert, &serverKey.PublicKey, key)
	if err != nil {
		return err
	}
	i.server = tls.Certificate{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}
	return nil
}

// issue signs an ephemeral client certificate for a public key (PEM, as
// the connector sends it), naming the IAM user it logs in as.
func (i *Instance) issue(publicKeyPEM, user string) (string, error) {
	block, _ := pem.Decode([]byte(publicKeyPEM))
	if block == nil {
		return "", errors.New("public_key is not PEM")
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("public_key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return "", err
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: user},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(i.cfg.CertLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, i.caCert, pub, i.caKey)
	if err != nil {
		return "", err
	}
	i.certs.Add(1)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}
