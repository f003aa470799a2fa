package test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestImagePushedByDigestPulledByPodman: the release's push
// (packaging/ociimage push, as the `image` publisher runs it) sends the
// image index to a registry (Debian's docker-registry, on a loopback port,
// with its own storage and configuration) by digest, and writes
// REPOSITORY@sha256:... to --digest-file, what the chart's
// workerImage.digest pins. podman pulls that reference, by digest alone
// (no tag was pushed), and gets this platform's image of the index: the
// same index digest, the same image ID (config digest) as the layout's.
func TestImagePushedByDigestPulledByPodman(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles packaging/ociimage and runs a registry; skipped with -short")
	}
	if _, err := exec.LookPath("docker-registry"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("docker-registry is missing in CI (Debian: apt-get install docker-registry)")
		}
		t.Skip("docker-registry not installed (Debian: apt-get install docker-registry)")
	}
	p := newPodman(t)
	root := moduleRoot(t)
	dir := t.TempDir()

	// The image, as the release builds it: both platforms in one layout.
	tool := filepath.Join(dir, "ociimage")
	runTool(t, root, []string{"CGO_ENABLED=0"}, "go", "build", "-o", tool, "./packaging/ociimage")
	layoutDir := filepath.Join(dir, imageLayout)
	for _, arch := range []string{"amd64", "arm64"} {
		runTool(t, dir, nil, tool, "add", "--layout", layoutDir, "--binary", workerBinary(t), "--os", "linux", "--arch", arch,
			"--version", "9.9.9", "--created", "1700000000")
	}

	// The registry: port 0, so the kernel picks a free one, which its log
	// names once it listens.
	config := filepath.Join(dir, "registry.yml")
	if err := os.WriteFile(config, []byte(`version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: `+filepath.Join(dir, "storage")+`
http:
  addr: 127.0.0.1:0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := exec.Command("docker-registry", "serve", config)
	stderr, err := reg.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	reg.Stdout = reg.Stderr
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Process.Kill(); reg.Wait() })
	listening := regexp.MustCompile(`listening on (127\.0\.0\.1:[0-9]+)`)
	sc := bufio.NewScanner(stderr)
	var addr string
	var logged []string
	for addr == "" && sc.Scan() {
		logged = append(logged, sc.Text())
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("docker-registry exited before listening:\n%s", strings.Join(logged, "\n"))
	}
	go func() {
		for sc.Scan() { // keep its log flowing, so it never blocks on a full pipe
		}
	}()

	repo := addr + "/fluksio/fluksio-worker"
	digestFile := filepath.Join(dir, "digest")
	runTool(t, root, nil, tool, "push", "--layout", layoutDir, "--repository", repo, "--digest-file", digestFile)
	b, err := os.ReadFile(digestFile)
	if err != nil {
		t.Fatal(err)
	}
	pushed := strings.TrimSpace(string(b))

	// What was built: the index's digest and this platform's image ID.
	lp, err := layout.FromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	indexDigest, _ := idx.Digest()
	if want := repo + "@" + indexDigest.String(); pushed != want {
		t.Fatalf("--digest-file says %q, want %s", pushed, want)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var imageID string
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == goarch(t) {
			img, err := idx.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigName()
			if err != nil {
				t.Fatal(err)
			}
			imageID = cfg.Hex
		}
	}
	if imageID == "" {
		t.Fatalf("the layout has no linux/%s image: %+v", goarch(t), im.Manifests)
	}

	// No tag was pushed: the digest is the only way to name it.
	if out, err := p.try("pull", "--tls-verify=false", repo+":latest"); err == nil {
		t.Errorf("pulling %s:latest succeeded, though only the digest was pushed:\n%s", repo, out)
	}
	p.run(t, "pull", "--quiet", "--tls-verify=false", pushed)
	got := strings.Fields(p.run(t, "image", "inspect", "--format", "{{.ID}} {{.Digest}}", pushed))
	if len(got) != 2 || got[0] != imageID || got[1] != indexDigest.String() {
		t.Errorf("podman pulled %v (ID, digest), want %s %s", got, imageID, indexDigest)
	}
}
