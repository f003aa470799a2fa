package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// TLSConfig is what the worker trusts for the engine (the WebSocket and the
// runner fetch): the system's authorities plus those in --ca-file. nil
// means Go's defaults, the system's alone.
func (c Config) TLSConfig() (*tls.Config, error) {
	if c.CAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca-file %s holds no PEM certificate (a -----BEGIN CERTIFICATE----- block); give the engine's CA certificate in PEM form", c.CAFile)
	}
	return &tls.Config{RootCAs: pool}, nil
}

// unknownAuthorityHint adds what to do to an error that says the engine's
// certificate is signed by an authority this machine does not trust.
func unknownAuthorityHint(err error) error {
	var unknown x509.UnknownAuthorityError
	var unknownPtr *x509.UnknownAuthorityError
	if errors.As(err, &unknown) || errors.As(err, &unknownPtr) {
		return fmt.Errorf("%w (the engine's certificate is signed by an authority this machine does not trust: if the engine uses its own CA, pass its certificate with --ca-file PATH, or point SSL_CERT_FILE at a bundle that holds it)", err)
	}
	return err
}

// systemBundles are where Linux distributions and macOS keep the system's
// authorities as one PEM file, as Go's crypto/x509 looks for them.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",                // Debian, Ubuntu, Gentoo, Arch
	"/etc/pki/tls/certs/ca-bundle.crt",                  // Fedora, RHEL 6
	"/etc/ssl/ca-bundle.pem",                            // openSUSE
	"/etc/pki/tls/cacert.pem",                           // OpenELEC
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", // CentOS, RHEL 7
	"/etc/ssl/cert.pem",                                 // Alpine, macOS
}

// nodeCABundle writes, for node processes, one PEM file with the
// authorities they should trust: those SSL_CERT_FILE already named (else
// the system's bundle) and --ca-file's. Node processes get it as
// SSL_CERT_FILE, which Python's ssl (and so the runtime's artifact
// requests) reads by default; pointing SSL_CERT_FILE at --ca-file alone
// would make every other HTTPS site untrusted to node code.
func nodeCABundle(cfg Config, stateDir string, getenv func(string) string) (string, error) {
	extra, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return "", fmt.Errorf("--ca-file: %w", err)
	}
	var base []byte
	candidates := systemBundles
	if own := getenv("SSL_CERT_FILE"); own != "" {
		candidates = []string{own}
	}
	for _, p := range candidates {
		if base, err = os.ReadFile(p); err == nil {
			break
		}
	}
	bundle := append(append(base, '\n'), extra...)
	path := filepath.Join(stateDir, "ca-bundle.pem")
	if err := writeFileAtomic(path, bundle, 0o600); err != nil {
		return "", err
	}
	return path, nil
}
