// Package deploy holds the files a couchq installation is made from (the
// compose file, systemd units, the worker config) and tests that they name
// only commands, flags, variables and keys that exist.
package deploy

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/couchq/couchq/internal/localserver"
)

// couchqBinary builds couchq once per test run, static (CGO off) as the
// Dockerfile builds it.
func couchqBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "couchq")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "../cmd/couchq")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// helpOf is a couchq command's usage text.
func helpOf(t *testing.T, bin, command string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, command, "-h")
	cmd.Stderr = &stderr
	_ = cmd.Run() // -h exits 0 or 2; the text is what matters
	if !strings.Contains(stderr.String(), "Usage: couchq "+command) {
		t.Fatalf("couchq %s -h is not a usage text: %s", command, stderr.String())
	}
	return stderr.String()
}

var flagRE = regexp.MustCompile(`^--[a-z][a-z0-9-]*`)

// checkArgs checks that args (a couchq command line, without the binary)
// name a command and only flags its usage lists.
func checkArgs(t *testing.T, bin, where string, args []string) {
	t.Helper()
	if len(args) == 0 {
		t.Errorf("%s: no couchq command", where)
		return
	}
	help := helpOf(t, bin, args[0])
	for _, a := range args[1:] {
		if f := flagRE.FindString(a); f != "" && !strings.Contains(help, f+" ") {
			t.Errorf("%s: couchq %s has no flag %s", where, args[0], f)
		}
	}
}

// workerTypes are the [types.NAME] tables of workers.toml, and its
// shutdown_timeout.
func checkWorkerFile(t *testing.T, bin string) (types map[string]bool, shutdown time.Duration) {
	t.Helper()
	// The password file the config names exists only where it is
	// deployed, and so does the email type's program: --check, which
	// finds what running would refuse, names it here.
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("change-me"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(extra ...string) ([]byte, error) {
		cmd := exec.Command(bin, append([]string{"worker", "--config", "workers.toml", "--check", "--password-file", pw}, extra...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // the file alone, no COUCHDB_* from the caller
		return cmd.CombinedOutput()
	}
	if out, err := check(); err == nil || !strings.Contains(string(out), `type email: handler exec: command "/usr/local/bin/send-email"`) {
		t.Errorf("couchq worker --config workers.toml --check where send-email is not installed: %v\n%s", err, out)
	}
	out, err := check("--handler", "noop")
	if err != nil {
		t.Fatalf("couchq worker --config workers.toml --check --handler noop: %v\n%s", err, out)
	}
	types = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^type (\S+):`).FindAllStringSubmatch(string(out), -1) {
		types[m[1]] = true
	}
	m := regexp.MustCompile(`(?m)^shutdown_timeout (\S+)$`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("--check prints no shutdown_timeout:\n%s", out)
	}
	if shutdown, err = time.ParseDuration(m[1]); err != nil {
		t.Fatal(err)
	}
	return types, shutdown
}

func TestComposeNamesOnlyWhatExists(t *testing.T) {
	bin := couchqBinary(t)
	types, shutdown := checkWorkerFile(t, bin)
	src, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Image           string            `yaml:"image"`
			Command         []string          `yaml:"command"`
			Environment     map[string]string `yaml:"environment"`
			Volumes         []string          `yaml:"volumes"`
			Secrets         []string          `yaml:"secrets"`
			StopGracePeriod string            `yaml:"stop_grace_period"`
			Init            bool              `yaml:"init"`
			Configs         []struct {
				Source string `yaml:"source"`
				Target string `yaml:"target"`
			} `yaml:"configs"`
		} `yaml:"services"`
		Secrets map[string]struct {
			File string `yaml:"file"`
		} `yaml:"secrets"`
		Configs map[string]struct {
			Content string `yaml:"content"`
		} `yaml:"configs"`
	}
	if err := yaml.Unmarshal(src, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	connHelp := helpOf(t, bin, "init")
	ranTypes := map[string]bool{}
	couchqServices := 0
	for name, svc := range compose.Services {
		for _, s := range svc.Secrets {
			if _, ok := compose.Secrets[s]; !ok {
				t.Errorf("service %s: secret %s is not declared", name, s)
			}
		}
		// CouchDB's settings go in as ini files the image reads at start
		// (etc/local.d), holding the settings the tests' servers run with.
		for _, c := range svc.Configs {
			cfg, ok := compose.Configs[c.Source]
			if !ok {
				t.Errorf("service %s: config %s is not declared", name, c.Source)
				continue
			}
			if !strings.HasPrefix(c.Target, "/opt/couchdb/etc/local.d/") || !strings.HasSuffix(c.Target, ".ini") {
				t.Errorf("service %s: config %s mounted at %s, where CouchDB does not read it", name, c.Source, c.Target)
			}
			for section, keys := range localserver.CompactionSettings() {
				for key, value := range keys {
					if !strings.Contains(cfg.Content, "["+section+"]\n"+key+" = "+value+"\n") {
						t.Errorf("config %s lacks [%s] %s = %s:\n%s", c.Source, section, key, value, cfg.Content)
					}
				}
			}
		}
		if strings.HasPrefix(svc.Image, "couchdb:") && len(svc.Configs) == 0 {
			t.Errorf("service %s runs CouchDB without couchq's compaction settings", name)
		}
		if !strings.HasPrefix(svc.Image, "couchq:") {
			continue
		}
		couchqServices++
		checkArgs(t, bin, "service "+name, svc.Command)
		for k := range svc.Environment {
			if !strings.Contains(connHelp, "$"+k) {
				t.Errorf("service %s: couchq reads no $%s", name, k)
			}
		}
		for _, v := range svc.Volumes {
			if host, _, _ := strings.Cut(v, ":"); strings.HasPrefix(host, "./") {
				if _, err := os.Stat(host); err != nil {
					t.Errorf("service %s: volume %s: %v", name, v, err)
				}
			}
		}
		if len(svc.Command) > 0 && svc.Command[0] == "worker" {
			for i, a := range svc.Command {
				if a == "--type" && i+1 < len(svc.Command) {
					typ := svc.Command[i+1]
					if !types[typ] {
						t.Errorf("service %s runs type %s, which workers.toml does not configure", name, typ)
					}
					ranTypes[typ] = true
				}
			}
			if !svc.Init {
				t.Errorf("service %s: no init: the worker would be PID 1, and the processes an exec command leaves behind zombies", name)
			}
			grace, err := time.ParseDuration(svc.StopGracePeriod)
			if err != nil || grace <= shutdown {
				t.Errorf("service %s: stop_grace_period %q must be above the workers' shutdown_timeout %s", name, svc.StopGracePeriod, shutdown)
			}
		}
	}
	for typ := range types {
		if !ranTypes[typ] {
			t.Errorf("workers.toml configures %s but no compose service runs it", typ)
		}
	}
	if couchqServices < 3 {
		t.Errorf("only %d couchq services", couchqServices)
	}
	// The secrets the instructions write are the files compose reads.
	files := map[string]bool{}
	for _, sec := range compose.Secrets {
		files[strings.TrimPrefix(sec.File, "./secrets/")] = true
	}
	guide, err := os.ReadFile("../docs/deploying.md")
	if err != nil {
		t.Fatal(err)
	}
	written := regexp.MustCompile(`> deploy/secrets/([A-Za-z0-9_.-]+)`)
	for where, text := range map[string][]byte{"compose.yaml": src, "docs/deploying.md": guide} {
		ms := written.FindAllSubmatch(text, -1)
		if len(ms) == 0 {
			t.Errorf("%s writes no secret", where)
		}
		for _, m := range ms {
			if !files[string(m[1])] {
				t.Errorf("%s writes deploy/secrets/%s, which compose does not read", where, m[1])
			}
		}
	}
}

func TestSystemdWorkerUnit(t *testing.T) {
	bin := couchqBinary(t)
	_, shutdown := checkWorkerFile(t, bin)
	unit, err := os.ReadFile("systemd/couchq-worker@.service")
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			settings[k] = v
		}
	}
	exec0 := strings.Fields(settings["ExecStart"])
	if len(exec0) < 2 || filepath.Base(exec0[0]) != "couchq" {
		t.Fatalf("ExecStart %q", settings["ExecStart"])
	}
	checkArgs(t, bin, "ExecStart", exec0[1:])
	if settings["KillSignal"] != "SIGTERM" || settings["Restart"] != "always" {
		t.Errorf("KillSignal %q, Restart %q", settings["KillSignal"], settings["Restart"])
	}
	stop, err := time.ParseDuration(settings["TimeoutStopSec"])
	if err != nil || stop <= shutdown {
		t.Errorf("TimeoutStopSec %q must be above the workers' shutdown_timeout %s", settings["TimeoutStopSec"], shutdown)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is not verified by systemd")
	}
	// Verified as an instance, with ExecStart pointing at the binary just built.
	dir := t.TempDir()
	text := strings.Replace(string(unit), "ExecStart="+exec0[0], "ExecStart="+bin, 1)
	if err := os.WriteFile(filepath.Join(dir, "couchq-worker@.service"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, "couchq-worker@email.service"))
	out, err := cmd.CombinedOutput()
	// Messages about the machine's own units are not ours.
	var ours []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "couchq-worker@") {
			ours = append(ours, line)
		}
	}
	if err != nil || len(ours) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// The binary the image ships is static: it runs on an empty image.
func TestStaticBinary(t *testing.T) {
	bin := couchqBinary(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Skipf("not an ELF binary on this platform: %v", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary asks for a dynamic loader: not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary links %v (%v)", libs, err)
	}
}

// The image builds with a daemonless builder (buildah, chroot isolation,
// vfs storage) and its binary runs in it as the non-root user. These
// machines reach no image registry, so the Dockerfile's golang stage is
// replaced by a "build" context holding what that stage makes (the static
// binary, passwd, CA certificates), and the final stage, FROM scratch,
// is built from the Dockerfile itself.
func TestImageBuilds(t *testing.T) {
	buildah, err := exec.LookPath("buildah")
	if err != nil {
		t.Skip("buildah is not installed (apt-get install buildah; there is no Docker engine here either): the image is not built; the static binary it ships is tested by TestStaticBinary")
	}
	ctxDir := t.TempDir()
	out := filepath.Join(ctxDir, "out")
	for _, d := range []string{"usr/local/bin", "etc/ssl/certs"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := couchqBinary(t)
	for path, body := range map[string]string{
		"etc/passwd": "couchq:x:65532:65532:couchq:/:/sbin/nologin\n",
		"etc/group":  "couchq:x:65532:\n",
	} {
		if err := os.WriteFile(filepath.Join(out, path), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(bin); err != nil || os.WriteFile(filepath.Join(out, "usr/local/bin/couchq"), b, 0o755) != nil {
		t.Fatalf("copying the binary: %v", err)
	}
	if certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		_ = os.WriteFile(filepath.Join(out, "etc/ssl/certs/ca-certificates.crt"), certs, 0o644)
	}
	storage := []string{"--storage-driver", "vfs", "--root", filepath.Join(t.TempDir(), "storage"), "--runroot", filepath.Join(t.TempDir(), "run")}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(buildah, append(storage, args...)...)
		cmd.Dir = ".."
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("buildah %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return string(b)
	}
	t.Cleanup(func() { _ = exec.Command(buildah, append(storage, "rm", "--all")...).Run() })
	run("bud", "--isolation", "chroot", "--pull-never", "--build-context", "build="+ctxDir, "-t", "couchq:test", "-f", "Dockerfile", ".")
	if user := strings.TrimSpace(run("inspect", "--format", "{{.OCIv1.Config.User}}", "couchq:test")); user != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532 (not root)", user)
	}
	ctr := strings.TrimSpace(run("from", "couchq:test"))
	if got := run("run", "--isolation", "chroot", ctr, "--", "/usr/local/bin/couchq", "help"); !strings.Contains(got, "Usage:") {
		t.Errorf("couchq help in the image:\n%s", got)
	}
}
