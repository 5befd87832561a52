// pod-security-check evaluates pod templates against a Pod Security Standard level with the upstream
// k8s.io/pod-security-admission policy code (the checks the API server's PodSecurity admission runs).
//
// Input on stdin: a JSON list of {"name": "...", "metadata": ObjectMeta, "spec": PodSpec}.
// Output on stdout: a JSON list of {"name", "allowed", "forbidden"}; exit status 1 if any pod is forbidden.
//
//	pod-security-check [LEVEL [VERSION]]   LEVEL privileged|baseline|restricted (default restricted),
//	                                       VERSION e.g. v1.34 or latest (default latest)
package main

import (
	"encoding/json"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
)

type podIn struct {
	Name     string            `json:"name"`
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     corev1.PodSpec    `json:"spec"`
}

type result struct {
	Name      string `json:"name"`
	Allowed   bool   `json:"allowed"`
	Forbidden string `json:"forbidden,omitempty"`
}

func die(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pod-security-check: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	levelArg, versionArg := "restricted", "latest"
	if len(os.Args) > 1 {
		levelArg = os.Args[1]
	}
	if len(os.Args) > 2 {
		versionArg = os.Args[2]
	}
	level, err := api.ParseLevel(levelArg)
	if err != nil {
		die("%v", err)
	}
	version, err := api.ParseVersion(versionArg)
	if err != nil {
		die("%v", err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		die("%v", err)
	}
	var pods []podIn
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&pods); err != nil {
		die("reading pods from stdin: %v", err)
	}
	lv := api.LevelVersion{Level: level, Version: version}
	out := make([]result, 0, len(pods))
	status := 0
	for i := range pods {
		agg := policy.AggregateCheckResults(evaluator.EvaluatePod(lv, &pods[i].Metadata, &pods[i].Spec))
		r := result{Name: pods[i].Name, Allowed: agg.Allowed}
		if !agg.Allowed {
			r.Forbidden = agg.ForbiddenDetail()
			status = 1
		}
		out = append(out, r)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		die("%v", err)
	}
	os.Exit(status)
}
