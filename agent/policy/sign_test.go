package policy

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const nodeSource = "from fluksio import node\n\n@node()\ndef train():\n    return 1\n"

// newKey writes a key pair into a test directory and returns the private
// key's path.
func newKey(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if _, err := GenerateKey(path); err != nil {
		t.Fatal(err)
	}
	return path
}

func signWith(t *testing.T, keyPath, src string, expires time.Time) string {
	t.Helper()
	key, err := ReadPrivateKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(Sign([]byte(src), key, expires))
}

func ringOf(t *testing.T, paths ...string) *KeyRing {
	t.Helper()
	r, err := LoadKeyRing(paths)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSignedSourceVerifies(t *testing.T) {
	key := newKey(t, "k")
	signed := signWith(t, key, nodeSource, time.Time{})
	if !strings.HasPrefix(signed, nodeSource) {
		t.Fatalf("signing changed the source before its line:\n%s", signed)
	}
	last := strings.TrimRight(signed, "\n")
	last = last[strings.LastIndexByte(last, '\n')+1:]
	if !signatureLine.MatchString(last) {
		t.Fatalf("the signature line does not follow its grammar: %q", last)
	}
	id, err := ringOf(t, key+PublicKeySuffix).Verify([]byte(signed), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ReadPrivateKey(key)
	if id != KeyID(pub.Public().(ed25519.PublicKey)) {
		t.Errorf("verified as key %s", id)
	}
	// A second signing replaces the line; an engine that strips or adds
	// the last newline changes nothing signed.
	again := signWith(t, key, signed, time.Time{})
	if strings.Count(again, signaturePrefix) != 1 {
		t.Errorf("signing twice left %d signature lines", strings.Count(again, signaturePrefix))
	}
	for _, variant := range []string{strings.TrimRight(signed, "\n"), signed + "\n\n"} {
		if _, err := ringOf(t, key+PublicKeySuffix).Verify([]byte(variant), time.Now()); err != nil {
			t.Errorf("%q: %v", variant[len(variant)-5:], err)
		}
	}
	// A file without a final newline is signed as if it had one.
	if _, err := ringOf(t, key+PublicKeySuffix).Verify([]byte(signWith(t, key, "x = 1", time.Time{})), time.Now()); err != nil {
		t.Error(err)
	}
}

func TestSignatureRefusesTamperedSource(t *testing.T) {
	key := newKey(t, "k")
	ring := ringOf(t, key+PublicKeySuffix)
	signed := signWith(t, key, nodeSource, time.Now().Add(time.Hour))
	for name, tampered := range map[string]string{
		"a changed byte":           strings.Replace(signed, "return 1", "return 2", 1),
		"a line added above":       "import os\n" + signed,
		"CRLF line endings":        strings.ReplaceAll(signed, "\n", "\r\n"),
		"the expiry moved":         strings.Replace(signed, "expires=20", "expires=21", 1),
		"the signature line moved": strings.Replace(signed, "def train", "x = 1\ndef train", 1),
	} {
		if _, err := ring.Verify([]byte(tampered), time.Now()); err == nil {
			t.Errorf("%s: verified", name)
		} else if !strings.Contains(err.Error(), "does not match") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSignatureRefusesOtherKeyExpiredMalformed(t *testing.T) {
	key, other := newKey(t, "k"), newKey(t, "other")
	ring := ringOf(t, key+PublicKeySuffix)
	expired := signWith(t, key, nodeSource, time.Now().Add(-time.Minute))
	signed := signWith(t, key, nodeSource, time.Time{})
	line := signed[len(nodeSource):]
	cases := map[string]struct{ src, want string }{
		"unsigned":          {nodeSource, "no signature line"},
		"another key":       {signWith(t, other, nodeSource, time.Time{}), "does not trust"},
		"expired":           {expired, "expired at"},
		"short signature":   {nodeSource + line[:len(line)-10] + "==\n", "malformed"},
		"unknown version":   {nodeSource + strings.Replace(line, " v1 ", " v9 ", 1), "unknown version"},
		"garbage after sig": {nodeSource + strings.TrimRight(line, "\n") + " x\n", "malformed"},
	}
	for name, c := range cases {
		_, err := ring.Verify([]byte(c.src), time.Now())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error saying %q", name, err, c.want)
		}
	}
}

func TestSignKeysAreKeptPrivate(t *testing.T) {
	key := newKey(t, "k")
	st, err := os.Stat(key)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %v %v", st.Mode(), err)
	}
	if _, err := GenerateKey(key); err == nil || !strings.Contains(err.Error(), "never overwritten") {
		t.Errorf("a second keygen over the key: %v", err)
	}
	os.Chmod(key, 0o644)
	if _, err := ReadPrivateKey(key); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a private key others can read: %v", err)
	}
	if _, err := LoadKeyRing([]string{key}); err == nil || !strings.Contains(err.Error(), "private key") {
		t.Errorf("trusting a private key: %v", err)
	}
	// A directory trusts each *.pub in it.
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		if _, err := GenerateKey(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if ids := ringOf(t, dir).IDs(); len(ids) != 2 {
		t.Errorf("a directory of two keys trusts %v", ids)
	}
	if !bytes.Contains(must(os.ReadFile(filepath.Join(dir, "a.pub"))), []byte(publicKeyWord+" ")) {
		t.Error("the public key file does not start with its type word")
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
