package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/fluksio/fluksio-worker/agent/config"
	"github.com/fluksio/fluksio-worker/platform"
)

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
func nodeCABundle(cfg config.Config, stateDir string, getenv func(string) string) (string, error) {
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
	if err := platform.WriteFileAtomic(path, bundle, 0o600, platform.KeepOwner); err != nil {
		return "", err
	}
	return path, nil
}
