package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
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

// ExplainTLSError adds what to do to an error that says the engine's
// certificate is signed by an authority this machine does not trust.
func ExplainTLSError(err error) error {
	var unknown x509.UnknownAuthorityError
	var unknownPtr *x509.UnknownAuthorityError
	if errors.As(err, &unknown) || errors.As(err, &unknownPtr) {
		return fmt.Errorf("%w (the engine's certificate is signed by an authority this machine does not trust: if the engine uses its own CA, pass its certificate with --ca-file PATH, or point SSL_CERT_FILE at a bundle that holds it)", err)
	}
	return err
}
