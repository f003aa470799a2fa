package policy

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Key file formats (SIGNING.md): one line of text each, a type word then
// the key in standard base64. The public key may carry a comment after it.
const (
	publicKeyWord  = "fluksio-ed25519-public"
	privateKeyWord = "fluksio-ed25519-private"
	// PublicKeySuffix names the public half next to the private key, and
	// the files of a --trust-key directory that are read.
	PublicKeySuffix = ".pub"
)

// keyIDLen is how many hex digits of the public key's sha256 name it: 64
// bits, enough that two keys of one owner never share an id, short enough
// to read in a log line.
const keyIDLen = 16

// KeyID names a public key: the first 16 hex digits of its sha256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])[:keyIDLen]
}

// GenerateKey makes a key pair and writes it: the private key to path
// (mode 0600, created new: an existing key is never overwritten) and the
// public one to path.pub. It returns the key id.
func GenerateKey(path string) (string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	id := KeyID(pub)
	pubLine := fmt.Sprintf("%s %s %s\n", publicKeyWord, base64.StdEncoding.EncodeToString(pub), id)
	privLine := fmt.Sprintf("%s %s\n", privateKeyWord, base64.StdEncoding.EncodeToString(priv.Seed()))
	if err := writeNew(path+PublicKeySuffix, pubLine, 0o644); err != nil {
		return "", err
	}
	if err := writeNew(path, privLine, 0o600); err != nil {
		os.Remove(path + PublicKeySuffix)
		return "", err
	}
	return id, nil
}

func writeNew(path, text string, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%s exists: a key is never overwritten; move it away or choose another name", path)
		}
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// ReadPrivateKey reads a private key file that keygen wrote. A file others
// may read is refused: whoever reads it can sign code this machine runs.
func ReadPrivateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 || fields[0] != privateKeyWord {
		if len(fields) > 0 && fields[0] == publicKeyWord {
			return nil, fmt.Errorf("%s is a public key: sign with the private key (the file without %s)", path, PublicKeySuffix)
		}
		return nil, fmt.Errorf("%s is not a fluksio private key (one line %q and the key in base64; make one with 'fluksio-worker keygen')", path, privateKeyWord)
	}
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %04o): whoever reads it can sign code; chmod 600 %s", path, st.Mode().Perm(), path)
	}
	seed, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s: the key is not %d bytes of base64", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// KeyRing is the public keys a worker trusts, by key id.
type KeyRing struct {
	keys map[string]ed25519.PublicKey
	from map[string]string // key id -> the file it was read from
}

// LoadKeyRing reads every key the paths name: a file holds one key a
// line (blank lines and # comments skipped); a directory, every *.pub file
// in it.
func LoadKeyRing(paths []string) (*KeyRing, error) {
	r := &KeyRing{keys: map[string]ed25519.PublicKey{}, from: map[string]string{}}
	for _, p := range paths {
		files, err := KeyFiles(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if err := r.readFile(f); err != nil {
				return nil, fmt.Errorf("--trust-key %s: %w", f, err)
			}
		}
	}
	return r, nil
}

// KeyFiles are the files a --trust-key path names: the file itself, or
// every *.pub file of a directory, sorted.
func KeyFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--trust-key %s: %w", path, err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	files, err := filepath.Glob(filepath.Join(path, "*"+PublicKeySuffix))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("--trust-key %s: the directory holds no *%s file", path, PublicKeySuffix)
	}
	sort.Strings(files)
	return files, nil
}

func (r *KeyRing) readFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	n := 0
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pub, err := parsePublicKey(line)
		if err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		id := KeyID(pub)
		r.keys[id], r.from[id] = pub, path
		n++
	}
	if n == 0 {
		return errors.New("no public key in it (a line " + publicKeyWord + " BASE64, as 'fluksio-worker keygen' writes)")
	}
	return nil
}

func parsePublicKey(line string) (ed25519.PublicKey, error) {
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != publicKeyWord {
		if len(fields) > 0 && fields[0] == privateKeyWord {
			return nil, errors.New("this is a private key: trust the public one (the file ending in " + PublicKeySuffix + "), and keep this one off the worker")
		}
		return nil, fmt.Errorf("not a public key: expected %q and the key in base64", publicKeyWord)
	}
	b, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("the key is not %d bytes of base64", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// IDs are the trusted keys' ids, sorted.
func (r *KeyRing) IDs() []string {
	ids := make([]string, 0, len(r.keys))
	for id := range r.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
