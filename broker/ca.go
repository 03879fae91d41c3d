package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// CA files, in the directory LoadOrCreateCA is given.
const (
	// CACertFile is the CA certificate (PEM, 0644): what guests trust.
	CACertFile = "ca.pem"
	// CAKeyFile is its private key (PEM, PKCS #8, 0600). It never leaves
	// the host: only the broker reads it.
	CAKeyFile  = "ca-key.pem"
	caLockFile = "ca.lock"
	// caValidity is how long a new CA is valid. Guests keep trusting it
	// across forks and templates, so it outlives them all.
	caValidity = 10 * 365 * 24 * time.Hour
	// maxCertStore bounds the host certificates the broker keeps signed.
	maxCertStore = 1024
)

// CA is vmfork's certificate authority: the broker signs with it a
// certificate for each host a secret is bound to, when it terminates a
// guest's TLS connection to that host.
type CA struct {
	cert  *x509.Certificate
	pem   []byte
	pair  tls.Certificate
	certs *certStore
}

// LoadOrCreateCA loads the CA kept in dir, making one (an ECDSA P-256 key
// and a self-signed certificate valid ten years) the first time. dir is
// made 0700 if missing. The key file must be 0600 (not readable by group
// or others): a CA key others can read could sign for any host the guests
// visit, so it is refused. Concurrent callers (two vmfork commands) get
// the same CA.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	lock, err := os.OpenFile(filepath.Join(dir, caLockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("ca: lock: %w", err)
	}
	// The certificate is renamed into place last, so it exists only with
	// its key.
	if _, err := os.Stat(certPath); errors.Is(err, fs.ErrNotExist) {
		if err := createCA(certPath, keyPath); err != nil {
			return nil, err
		}
	}
	return loadCA(certPath, keyPath)
}

func createCA(certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"vmfork"},
			CommonName:   "vmfork secrets broker CA (" + host + ")",
		},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// It signs host certificates only, never another CA.
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	if err := writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	return nil
}

func loadCA(certPath, keyPath string) (*CA, error) {
	fi, err := os.Stat(keyPath)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("ca: %s is mode %#o: the CA key must be readable by its owner only (chmod 600)", keyPath, m)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("ca: %s and %s: %w", certPath, keyPath, err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("ca: %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("ca: %s is not a CA certificate", certPath)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("ca: %s expired on %s: remove it and %s to make a new one (guests must then be given the new one)",
			certPath, cert.NotAfter.Format(time.DateOnly), CAKeyFile)
	}
	pair.Leaf = cert
	return &CA{cert: cert, pem: certPEM, pair: pair, certs: &certStore{m: map[string]*tls.Certificate{}}}, nil
}

// PEM returns the CA certificate, PEM-encoded: what a guest's trust
// store gets (GuestFiles, TrustStoreOf).
func (ca *CA) PEM() []byte { return ca.pem }

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// certStore caches host certificates (goproxy's CertStorage): signing one
// costs a key generation, and a guest opens many connections to one host.
type certStore struct {
	mu sync.Mutex
	m  map[string]*tls.Certificate
}

func (s *certStore) Fetch(host string, gen func() (*tls.Certificate, error)) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.m[host]; ok && time.Now().Before(c.Leaf.NotAfter) {
		return c, nil
	}
	c, err := gen()
	if err != nil {
		return nil, err
	}
	if len(s.m) >= maxCertStore {
		clear(s.m) // rare: more bound hosts than this are not expected
	}
	s.m[host] = c
	return c, nil
}

// writeFileAtomic replaces path with data, mode perm, through a synced
// temporary file and a rename, so a reader (or a crash) never sees half
// a file.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
