package test

// The chart's pods under a real container runtime: Debian's podman 4.3 with
// runc runs the rendered manifests (`podman kube play`) with the worker's
// OCI image and a Python user image, against the test engine on loopback.
// What this proves and what it does not is in TestHelmChartUnderPodman.

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/fluksio/fluksio-worker/agent/enginetest"
	"github.com/fluksio/fluksio-worker/agent/status"
	"github.com/fluksio/fluksio-worker/test/nspawn"
)

// userImage is the Python image the pods run: the Debian rootfs the
// nspawn tests build, imported once per run.
const userImage = "localhost/fluksio-test/python:bookworm"

// podman runs podman with a private configuration and storage under a
// temporary directory, removed at the end of the test. Its methods fail
// the test t given to them.
type podman struct {
	dir string
	env []string
}

// newPodman sets podman up for this host, without touching the host's own
// containers, images or configuration. Skipped (failed under CI) when
// podman, runc or catatonit (podman's pause binary) is missing, or when not
// root.
func newPodman(t *testing.T) *podman {
	t.Helper()
	var missing []string
	for _, tool := range []string{"podman", "runc", "catatonit"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	why := ""
	switch {
	case len(missing) > 0:
		why = "missing " + strings.Join(missing, ", ") + " (Debian: apt-get install podman runc catatonit)"
	case os.Geteuid() != 0:
		why = "podman's pods need root here"
	}
	if why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("podman unavailable in CI: %s", why)
		}
		t.Skip(why)
	}
	dir, err := os.MkdirTemp("", "fluksio-podman-")
	if err != nil {
		t.Fatal(err)
	}
	p := &podman{dir: dir}
	// Workarounds for this host, not for the chart:
	//   - runc, not crun: Debian's crun 1.8 refuses a hybrid cgroup
	//     layout ("cgroups in hybrid mode not supported").
	//   - cgroupfs and a file events logger: systemd is not PID 1.
	//   - default ulimits within the sandbox's hard limits: podman asks
	//     for nofile 1048576 and nproc 4194304 and is refused (and this
	//     sandbox refuses an nproc above kernel.pid_max, whatever the hard
	//     limit says).
	//   - storage, run, network and temporary directories of its own, so
	//     nothing of the host's podman is seen or changed (not even by the
	//     `system reset` that cleans up).
	var nofile, nproc syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
	syscall.Getrlimit(6 /* RLIMIT_NPROC */, &nproc)
	pidMax := uint64(32768)
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			pidMax = n
		}
	}
	conf := fmt.Sprintf(`[containers]
default_ulimits = ["nofile=%[1]d:%[1]d", "nproc=%[2]d:%[2]d"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "%[3]s/events.log"
tmp_dir = "%[3]s/tmp"
[network]
network_config_dir = "%[3]s/networks"
`, min(nofile.Cur, 65536), min(nproc.Cur, pidMax), dir)
	storage := fmt.Sprintf("[storage]\ndriver = \"overlay\"\nrunroot = %q\ngraphroot = %q\n", filepath.Join(dir, "run"), filepath.Join(dir, "root"))
	for name, text := range map[string]string{"containers.conf": conf, "storage.conf": storage} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p.env = []string{"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"), "CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf")}
	t.Cleanup(func() {
		p.try("pod", "rm", "--all", "--force", "--time", "0")
		p.try("system", "reset", "--force")
		os.RemoveAll(dir)
	})
	return p
}

// run runs podman, failing the test with its output if it fails.
func (p *podman) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.try(args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (p *podman) try(args ...string) (string, error) {
	return p.input(nil, args...)
}

func (p *podman) input(stdin *os.File, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// state is a container's state and exit code.
func (p *podman) state(t *testing.T, ctr string) (string, int) {
	t.Helper()
	out := p.run(t, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", ctr)
	status, code, _ := strings.Cut(out, " ")
	n, _ := strconv.Atoi(code)
	return status, n
}

// loadImages loads the worker's OCI image, as the release builds it
// (packaging/ociimage from a static build of the code under test), offline with
// `podman pull oci:DIR:REF`, under the chart's default name and tag; and
// imports the Debian rootfs as the user's Python image. PATH must be set
// by the import, or the worker finds no python3.
func (p *podman) loadImages(t *testing.T, ctx context.Context) {
	t.Helper()
	appVersion := chartAppVersion(t)
	// The image's binary is static, as the release's: the one under test
	// may be built with cgo (the race detector needs it).
	tool, bin := filepath.Join(p.dir, "ociimage"), filepath.Join(p.dir, "fluksio-worker")
	runTool(t, moduleRoot(t), []string{"CGO_ENABLED=0"}, "go", "build", "-o", tool, "./packaging/ociimage")
	runTool(t, moduleRoot(t), []string{"CGO_ENABLED=0"}, "go", "build", "-o", bin, ".")
	layoutDir := filepath.Join(p.dir, imageLayout)
	runTool(t, p.dir, nil, tool, "add", "--layout", layoutDir, "--binary", bin, "--os", "linux", "--arch", goarch(t),
		"--version", appVersion, "--created", "1700000000")
	id := lastLine(p.run(t, "pull", "--quiet", "oci:"+layoutDir+":"+appVersion))
	p.run(t, "tag", id, "ghcr.io/fluksio/fluksio-worker:"+appVersion)

	rootfs, err := nspawn.Rootfs(ctx)
	if err != nil {
		t.Fatalf("the Debian rootfs for the user image: %v", err)
	}
	tarball := filepath.Join(p.dir, "rootfs.tar")
	runTool(t, rootfs, nil, "tar", "--create", "--file", tarball, "--one-file-system", ".")
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if out, err := p.input(f, "import", "--change", "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "-", userImage); err != nil {
		t.Fatalf("podman import: %v\n%s", err, out)
	}
	os.Remove(tarball)
}

func goarch(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// makeSecret stands in for the token Secret the chart's pods mount. Two
// gaps of `kube play` 4.3, worked around here:
//   - a Secret's `data` is written into the volume still base64-encoded,
//     so the podman secret holds a Secret whose data is the token itself;
//   - the files of a Secret volume are written root-owned, mode 0644,
//     whatever defaultMode and fsGroup say (and fsGroup is not given to
//     the processes): the volume, which podman names after the Secret, is
//     made beforehand with the file as the kubelet writes it (root, group
//     fsGroup, defaultMode), and podman leaves it so.
func (p *podman) makeSecret(t *testing.T, name, key string, gid int64, mode fs.FileMode) {
	t.Helper()
	secret := fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: %s}\ndata: {%s: %s}\n", name, key, testToken)
	file := filepath.Join(p.dir, "secret.yaml")
	if err := os.WriteFile(file, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	p.run(t, "secret", "create", name, file)
	os.Remove(file)
	p.run(t, "volume", "create", name)
	dir := p.run(t, "volume", "inspect", "--format", "{{.Mountpoint}}", name)
	tok := filepath.Join(dir, key)
	if err := os.WriteFile(tok, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tok, 0, int(gid)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tok, mode); err != nil {
		t.Fatal(err)
	}
}

// playable adapts a pod spec the chart rendered to what `kube play` 4.3
// runs here; every change is a gap of podman or of this host, none a fault
// of the chart:
//   - host networking, so the pod reaches the engine on 127.0.0.1 and the
//     host reaches the worker's port (no CNI network here);
//   - no `ports:`: refused with host networking;
//   - no probes: podman runs them as healthchecks through systemd timers
//     and curl in the image, neither of which is here; the test asks the
//     probes' URLs from the host instead (probeOK, startKubelet);
//   - restartPolicy Never: with a Deployment's Always, podman restarts the
//     init container forever once it has exited;
//   - each emptyDir renamed after the pod: podman makes it a named volume
//     shared by every pod using the name, and it would outlive the pod;
//   - the Secret volume's `optional:` set: unset, kube play panics.
func playable(spec corev1.PodSpec, pod string) corev1.PodSpec {
	spec = *spec.DeepCopy()
	spec.HostNetwork = true
	spec.RestartPolicy = corev1.RestartPolicyNever
	renamed := map[string]string{}
	for i, v := range spec.Volumes {
		switch {
		case v.EmptyDir != nil:
			renamed[v.Name] = pod + "-" + v.Name
			spec.Volumes[i].Name = renamed[v.Name]
		case v.Secret != nil && v.Secret.Optional == nil:
			no := false
			spec.Volumes[i].Secret.Optional = &no
		}
	}
	fix := func(cs []corev1.Container) {
		for i := range cs {
			cs[i].Ports = nil
			cs[i].StartupProbe, cs[i].LivenessProbe, cs[i].ReadinessProbe = nil, nil, nil
			for j, m := range cs[i].VolumeMounts {
				if n, ok := renamed[m.Name]; ok {
					cs[i].VolumeMounts[j].Name = n
				}
			}
		}
	}
	fix(spec.InitContainers)
	fix(spec.Containers)
	return spec
}

// play runs a pod spec as a Pod (kube play 4.3 has no Job kind, and a
// Deployment's pod is its template) and returns the main container's
// name. The pod is removed at the end of the test.
func (p *podman) play(t *testing.T, name string, spec corev1.PodSpec) string {
	t.Helper()
	pod := corev1.Pod{Spec: playable(spec, name)}
	pod.APIVersion, pod.Kind, pod.Name = "v1", "Pod", name
	b, err := yaml.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(p.dir, name+".yaml")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.try("pod", "rm", "--force", "--time", "0", name)
		for _, v := range pod.Spec.Volumes {
			if v.EmptyDir != nil {
				p.try("volume", "rm", "--force", v.Name)
			}
		}
	})
	if out, err := p.try("kube", "play", file); err != nil {
		t.Fatalf("podman kube play: %v\n%s\n%s", err, out, b)
	}
	return name + "-" + spec.Containers[0].Name
}

// insideCode is node code reporting what the pod's security settings left
// it: run by the worker in the user image's /usr/bin/python3.
const insideCode = `
import errno, os, sys

def inside():
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    try:
        open("/usr/fluksio-write-test", "w").close()
        root = "writable"
    except OSError as e:
        root = errno.errorcode.get(e.errno, str(e.errno))
    try:
        with open("/tmp/fluksio-write-test", "w") as f:
            f.write("x")
        tmp = "writable"
    except OSError as e:
        tmp = errno.errorcode.get(e.errno, str(e.errno))
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
            "cap_eff": status["CapEff"], "cap_prm": status["CapPrm"], "cap_bnd": status["CapBnd"],
            "no_new_privs": status["NoNewPrivs"], "root": root, "tmp": tmp,
            "python": os.path.realpath(sys.executable)}
`

// reachCode is node code reporting what it can reach of the worker's own:
// the token file and the state directory, at the paths the pod gives the
// worker. In a sandbox the token reads empty, and the state directory is a
// read-only stand-in showing only the runner's script and the call's own
// directory.
const reachCode = `
import errno, os

def reach(token_file, state_dir):
    def err(e):
        return errno.errorcode.get(e.errno, str(e.errno))
    def listing(d):
        try:
            return sorted(os.listdir(d))
        except OSError as e:
            return err(e)
    try:
        with open(token_file) as f:
            token = len(f.read())
    except OSError as e:
        token = err(e)
    try:
        open(os.path.join(state_dir, "planted"), "w").close()
        write = "writable"
    except OSError as e:
        write = err(e)
    return {"token_bytes": token, "state": listing(state_dir), "state_write": write,
            "calls": listing(os.path.join(state_dir, "calls")),
            "artifacts": listing(os.path.join(state_dir, "artifacts")),
            "shown": listing(os.path.join(state_dir, "artifacts", "shown")),
            "own": os.path.basename(os.environ["FLUKSIO_CALL_DIR"])}
`

// slowCode is a call that says it runs, then runs until stopped.
const slowCode = `
import time

def slow():
    print("running", flush=True)
    time.sleep(600)
`

// TestHelmChartUnderPodman runs the chart's pods in a real container
// runtime: the OCI image the release builds (packaging/ociimage from the
// binary under test), loaded offline, is the init container that copies
// the worker into the emptyDir; a Python image made from a Debian rootfs
// is the main container, whose /usr/bin/python3 runs a real call through
// the embedded runtime, against the test engine on loopback.
//
//   - deployment: the init container ran as its own user and left the
//     binary; the worker attaches with the token from the Secret volume
//     (no warning about its mode); the probes' URLs answer from the host
//     (/livez, /healthz: podman does not run HTTP probes here), and,
//     asked as a kubelet would through an engine outage longer than the
//     liveness window, would make the pod unready, never restart it; the call
//     reports, from inside the pod, uid and gid 1000, no capabilities,
//     no_new_privs, a read-only root and a writable /tmp; stopping the pod
//     (SIGTERM) while a call runs stops the call, which is answered, and
//     ends the worker with exit 0 within terminationGracePeriodSeconds.
//     The worker's status says its calls are sandboxed, and a call reads
//     neither the token (hidden) nor the worker's state (only its own
//     directory and the runner's script are shown, read-only).
//   - job and scaledJob: the Job's and the KEDA ScaledJob's pod template
//     run one call and exit 0 (--max-calls 1); the Job's with
//     sandbox.mode on and allowNamespaces.
//
// Not covered: a kubelet's probes and restarts, a cluster's networking
// (host networking here), the pod's resource limits, the drain's preStop
// hook and stop signal (TestHelmChartPodRuns runs the hook), fsGroup and
// a Secret volume's defaultMode (podman ignores both; see makeSecret), the
// seccomp and AppArmor profiles the chart sets (kube play 4.3 takes seccomp
// from annotations only; no AppArmor on this host; podman's default
// profile allows the sandbox anyway).
func TestHelmChartUnderPodman(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads images into podman and runs pods; skipped with -short")
	}
	// The pods' user image is the Debian rootfs the machine tests build
	// (debootstrap): skipped, saying why, where they are.
	nspawn.Require(t)
	pm := newPodman(t)
	helm := installHelm(t)
	chart := filepath.Join(moduleRoot(t), chartDir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	pm.loadImages(t, ctx)
	t.Logf("images loaded in %v", time.Since(start).Round(100*time.Millisecond))

	render := func(t *testing.T, values string, eng *enginetest.Engine, port int, extra ...string) rendered {
		args := []string{"template", "rel", ".", "-f", filepath.Join(chart, "ci", values),
			"--set", "image.repository=" + strings.Split(userImage, ":")[0], "--set", "image.tag=" + strings.Split(userImage, ":")[1],
			"--set", "engine.url=" + eng.AttachURL(), "--set", "metrics.port=" + strconv.Itoa(port),
			"--set", "token.existingSecret=fluksio-worker-token", "--set", "token.key=token",
			// The pods run the worker image loaded here, by its tag: not
			// the release digest a values file pins (job-values.yaml).
			"--set", "workerImage.digest="}
		return decodeStrict(t, runTool(t, chart, nil, helm, append(args, extra...)...))
	}
	// One Secret for every pod, as the chart mounts it.
	{
		eng := startEngine(t, enginetest.Options{})
		r := render(t, "minimal-values.yaml", eng, 1)
		spec := r.deployments[0].Spec.Template.Spec
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				pm.makeSecret(t, v.Secret.SecretName, v.Secret.Items[0].Path, *spec.SecurityContext.FSGroup, fs.FileMode(*v.Secret.DefaultMode))
			}
		}
	}

	t.Run("deployment", func(t *testing.T) {
		eng := startEngine(t, enginetest.Options{})
		port := freePort(t)
		// Probes at the kubelet's smallest period, so an engine outage
		// longer than the liveness window takes seconds.
		r := render(t, "minimal-values.yaml", eng, port, "--set-json", `extraArgs=["--health-grace","1s"]`,
			"--set", "livenessProbe.periodSeconds=1", "--set", "livenessProbe.failureThreshold=3",
			"--set", "readinessProbe.periodSeconds=1", "--set", "readinessProbe.failureThreshold=1")
		spec := r.deployments[0].Spec.Template.Spec
		main := spec.Containers[0]
		ctr := pm.play(t, "deployment", spec)
		attach(t, eng)

		// The init container ran as its user and left the binary.
		binVol := "deployment-" + spec.InitContainers[0].VolumeMounts[0].Name
		bin := filepath.Join(pm.run(t, "volume", "inspect", "--format", "{{.Mountpoint}}", binVol), "fluksio-worker")
		st, err := os.Stat(bin)
		if err != nil {
			t.Fatalf("the init container left no binary: %v", err)
		}
		if sys := st.Sys().(*syscall.Stat_t); int64(sys.Uid) != *spec.InitContainers[0].SecurityContext.RunAsUser || st.Mode().Perm() != 0o755 {
			t.Errorf("the copied binary is uid %d mode %v; want the init container's user %d, 0755", sys.Uid, st.Mode(), *spec.InitContainers[0].SecurityContext.RunAsUser)
		}

		for _, probe := range []*corev1.Probe{main.StartupProbe, main.LivenessProbe, main.ReadinessProbe} {
			eventually(t, 10*time.Second, "GET "+probe.HTTPGet.Path+" from the host to answer 200", func() bool {
				return probeOK(t, main, probe)
			})
		}

		// The engine away for longer than the liveness window: unready,
		// ready again, never a restart.
		wk := outlastLiveness(t, eng, main)

		answer, _ := runNode(t, wk, nodeRun("inside", insideCode, "inside", nil))
		out := outputsOf(t, answer)
		psc := spec.SecurityContext
		want := map[string]any{
			"uid": float64(*psc.RunAsUser), "gid": float64(*psc.RunAsGroup),
			"cap_eff": "0000000000000000", "cap_prm": "0000000000000000", "cap_bnd": "0000000000000000",
			"no_new_privs": "1", "root": "EROFS", "tmp": "writable", "python": "/usr/bin/python3.11",
		}
		for k, v := range want {
			if out[k] != v {
				t.Errorf("inside the pod %s = %v, want %v", k, out[k], v)
			}
		}
		t.Logf("inside the pod: %v", out)

		// The calls' sandbox: on (podman's default seccomp profile,
		// containers-common's, allows a user namespace and mounts in it,
		// and this host has no AppArmor), as the worker's status file in
		// the state volume says; a call reads neither the token nor the
		// worker's state (its status file, other calls), and writes none.
		stateDir := main.Args[slices.Index(main.Args, "--state-dir")+1]
		stateVol := pm.run(t, "volume", "inspect", "--format", "{{.Mountpoint}}", "deployment-"+mountedAt(main, stateDir))
		ws, err := status.Read(stateVol)
		if err != nil || !strings.HasPrefix(ws.Sandbox, "on") {
			t.Errorf("the worker's status in the pod says sandbox %q (%v), want on", ws.Sandbox, err)
		}
		tokenFile := main.Args[slices.Index(main.Args, "--token-file")+1]
		answer, _ = runNode(t, wk, nodeRun("reach", reachCode, "reach", map[string]any{"token_file": tokenFile, "state_dir": stateDir}))
		reached := outputsOf(t, answer)
		t.Logf("a call in the pod reaches: %v", reached)
		if reached["token_bytes"] != float64(0) {
			t.Errorf("a call in the pod reads %v bytes of the token file, want none (hidden)", reached["token_bytes"])
		}
		state, _ := reached["state"].([]any)
		for _, e := range state {
			if e != "calls" && e != "runtime" && e != "artifacts" {
				t.Errorf("a call in the pod sees %v in the state directory; want only calls/ (its own), runtime/ and artifacts/shown/", e)
			}
		}
		// Of the artifact cache, only the directory its entries are
		// loaded from by digest, which a call cannot list.
		if a, _ := reached["artifacts"].([]any); len(a) != 1 || a[0] != "shown" || reached["shown"] != "EACCES" {
			t.Errorf("a call in the pod sees the artifact cache as %v, and its shown entries as %v; want only shown/, not to be listed (EACCES)", reached["artifacts"], reached["shown"])
		}
		if _, err := os.Stat(filepath.Join(stateVol, "status.json")); err != nil || len(state) == 0 {
			t.Errorf("the state directory itself: %v, listed from the call as %v", err, reached["state"])
		}
		if calls, _ := reached["calls"].([]any); len(calls) > 1 || (len(calls) == 1 && calls[0] != reached["own"]) {
			t.Errorf("a call in the pod sees the call directories %v; want only its own, %v", calls, reached["own"])
		}
		if reached["state_write"] != "EROFS" {
			t.Errorf("a call in the pod writing in the state directory: %v, want EROFS", reached["state_write"])
		}

		// The pod is stopped (SIGTERM) while a call runs: the call is
		// stopped and answered, the worker exits 0 within the grace.
		call := startNode(t, wk, nodeRun("slow", slowCode, "slow", nil))
		if _, err := call.Next(timeoutCtx(t, 30*time.Second)); err != nil {
			t.Fatalf("the slow call said nothing: %v", err)
		}
		grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		// kube play 4.3 does not take the stop timeout from
		// terminationGracePeriodSeconds (it keeps 10 s): given here.
		begin := time.Now()
		pm.run(t, "pod", "stop", "--time", strconv.Itoa(int(grace/time.Second)), "deployment")
		took := time.Since(begin)
		if status, code := pm.state(t, ctr); status != "exited" || code != 0 || took >= grace {
			t.Errorf("stopped: %s, exit %d after %v; want exited 0 within the grace of %v", status, code, took.Round(time.Millisecond), grace)
		}
		t.Logf("stopped with a call running in %v (grace %v)", took.Round(time.Millisecond), grace)
		if answer, _, err := call.WaitTimeout(5 * time.Second); err != nil || answer.OK {
			t.Errorf("the call running at the stop: %v %s; want an error answer (stopped with the worker)", err, answer.Raw)
		}
		logs := pm.run(t, "logs", ctr)
		if strings.Contains(logs, "holds the token and is mode") || strings.Contains(logs, testToken) {
			t.Errorf("the worker warned about the Secret's token file, or showed the token:\n%s", logs)
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", logs)
		}
	})

	// The Job's pod with sandbox.mode on and allowNamespaces: the pod
	// plays, and its worker, which starts only with a sandbox, runs its
	// call. (kube play 4.3 takes seccomp from annotations only and this
	// host has no AppArmor: the profiles themselves are not tried here.)
	for _, c := range []struct {
		name, values string
		set          []string
	}{
		{"job", "job-values.yaml", []string{"--set", "sandbox.mode=on", "--set", "sandbox.allowNamespaces=true"}},
		{"scaledjob", "scaledjob-values.yaml", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			eng := startEngine(t, enginetest.Options{})
			r := render(t, c.values, eng, freePort(t), append([]string{"--set", "gpus=0", "--set", "oneShot.maxCalls=1"}, c.set...)...)
			var spec corev1.PodSpec
			if len(r.jobs) == 1 {
				spec = r.jobs[0].Spec.Template.Spec
			} else {
				spec = r.scaledJobs[0].Spec.JobTargetRef.Template.Spec
			}
			ctr := pm.play(t, c.name, spec)
			wk := attach(t, eng)
			answer, _ := runNode(t, wk, nodeRun("one", insideCode, "inside", nil))
			outputsOf(t, answer)
			var status string
			var code int
			eventually(t, 30*time.Second, "the one-shot worker to exit after its call", func() bool {
				status, code = pm.state(t, ctr)
				return status == "exited"
			})
			if code != 0 {
				t.Errorf("the one-shot worker exited %d, want 0\n%s", code, pm.run(t, "logs", ctr))
			}
		})
	}
}
