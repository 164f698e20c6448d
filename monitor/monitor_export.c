/* JSON and Prometheus renderings of a job snapshot (see monitor_export.h). One table of process
 * metrics drives both, so the two never disagree on what a counter means. */
#include "monitor_export.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum field { F_STEP, F_CHUNK, F_IN, F_OUT, F_BUSY, F_UPDATE, F_LANE_WAIT, F_WAIT, F_ITEMS, F_RESTARTS, F_HEARTBEAT_AGE };

struct proc_metric {
    const char *prom; /* after slidedp_<kind>_ */
    const char *type;
    const char *json;
    enum field field;
    const char *help;
};

static const struct proc_metric worker_metrics[] = {
    {"step", "gauge", "step", F_STEP, "Optimizer step the worker is computing."},
    {"chunk", "gauge", "chunk", F_CHUNK, "Parameter chunk the worker is fetching or computing (-1: none)."},
    {"h2d_bytes_total", "counter", "h2d_bytes", F_IN, "Weight bytes copied from host memory to the device."},
    {"d2h_bytes_total", "counter", "d2h_bytes", F_OUT, "Gradient bytes copied from the device to host memory."},
    {"busy_seconds_total", "counter", "busy_s", F_BUSY, "Seconds spent in micro-steps, waits inside them included."},
    {"wait_seconds_total", "counter", "wait_s", F_WAIT, "Seconds spent waiting for weights or gradient slots."},
    {"micro_steps_total", "counter", "micro_steps", F_ITEMS, "Training micro-steps completed."},
    {"restarts_total", "counter", "restarts", F_RESTARTS, "Times the launcher restarted this worker."},
    {"heartbeat_age_seconds", "gauge", "heartbeat_age_s", F_HEARTBEAT_AGE,
     "Seconds since the worker last changed phase."},
};

static const struct proc_metric optim_metrics[] = {
    {"step", "gauge", "step", F_STEP, "Optimizer step the process is reducing or applying."},
    {"chunk", "gauge", "chunk", F_CHUNK, "Parameter chunk the process is reducing or updating (-1: none)."},
    {"reduced_bytes_total", "counter", "reduced_bytes", F_IN, "Gradient bytes summed into the accumulators."},
    {"published_bytes_total", "counter", "published_bytes", F_OUT, "bf16 parameter bytes written after updates."},
    {"busy_seconds_total", "counter", "busy_s", F_BUSY, "Seconds spent reducing gradients and updating chunks."},
    {"update_seconds_total", "counter", "update_s", F_UPDATE, "Seconds of busy_s spent updating chunks."},
    {"lane_wait_seconds_total", "counter", "lane_wait_s", F_LANE_WAIT,
     "Seconds of busy_s the threads idled waiting for the slowest one, averaged over the threads."},
    {"wait_seconds_total", "counter", "wait_s", F_WAIT, "Seconds spent waiting for gradients."},
    {"chunk_updates_total", "counter", "chunk_updates", F_ITEMS, "Chunk updates applied."},
    {"restarts_total", "counter", "restarts", F_RESTARTS, "Times the launcher restarted this process."},
    {"heartbeat_age_seconds", "gauge", "heartbeat_age_s", F_HEARTBEAT_AGE,
     "Seconds since the process last changed phase."},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* NaN when the value does not exist (a process that has not started). */
static double proc_value(const struct mon_proc *p, enum field field, uint64_t now_ns)
{
    switch (field) {
    case F_STEP:
        return p->step;
    case F_CHUNK:
        return p->chunk;
    case F_IN:
        return (double)p->bytes_in;
    case F_OUT:
        return (double)p->bytes_out;
    case F_BUSY:
        return (double)p->busy_ns / 1e9;
    case F_UPDATE:
        return (double)p->update_ns / 1e9;
    case F_LANE_WAIT:
        return (double)p->lane_wait_ns / 1e9;
    case F_WAIT:
        return (double)p->wait_ns / 1e9;
    case F_ITEMS:
        return (double)p->items;
    case F_RESTARTS:
        return p->restarts;
    case F_HEARTBEAT_AGE:
        return p->heartbeat_ns == 0 ? NAN : now_ns > p->heartbeat_ns ? (double)(now_ns - p->heartbeat_ns) / 1e9 : 0;
    }
    return NAN;
}

/* The shortest text that reads back as exactly v (cJSON's own printing may round). */
static void exact(char *buf, size_t len, double v)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, len, "%.*g", digits, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static const char *status_name(const struct mon_snapshot *s)
{
    return s->stop ? "stopping" : s->stalled ? "stalled" : "running";
}

/* ---- JSON ---- */

/* A number, or null for a value that does not exist (NaN). */
static void num(cJSON *o, const char *key, double v)
{
    char buf[40];
    if (!isfinite(v)) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    exact(buf, sizeof buf, v);
    cJSON_AddRawToObject(o, key, buf);
}

static cJSON *json_procs(const struct mon_proc *procs, int n, const char *index_key, const struct proc_metric *pm,
                         int num_metrics, uint64_t now_ns)
{
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) {
        const struct mon_proc *p = &procs[i];
        cJSON *o = cJSON_CreateObject();
        num(o, index_key, i);
        num(o, "pid", p->pid);
        cJSON_AddStringToObject(o, "device", p->device);
        cJSON_AddStringToObject(o, "phase", mon_phase_name(p->phase));
        cJSON_AddBoolToObject(o, "stalled", p->stalled);
        for (int k = 0; k < num_metrics; k++)
            num(o, pm[k].json, proc_value(p, pm[k].field, now_ns));
        if (p->peak_flops > 0)
            num(o, "peak_flops", p->peak_flops);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

char *mon_json(const struct mon *m, const struct mon_snapshot *s)
{
    const struct ctl_header *h = m->h;
    const struct job_stats *st = &s->stats;
    cJSON *root = cJSON_CreateObject();
    cJSON *job = cJSON_AddObjectToObject(root, "job");
    cJSON_AddStringToObject(job, "name", m->name);
    num(job, "launcher_pid", s->launcher_pid);
    cJSON_AddStringToObject(job, "status", status_name(s));
    cJSON_AddStringToObject(job, "ini", h->job.ini_path);
    cJSON_AddStringToObject(job, "log_dir", h->job.log_dir);
    cJSON_AddStringToObject(job, "checkpoint_dir", h->job.ckpt_dir);
    cJSON_AddStringToObject(job, "device", h->job.device == DEVICE_CPU ? "cpu" : "cuda");
    num(job, "gpus", h->gpus);
    num(job, "optimizer_processes", h->optim_procs);
    num(job, "chunks", h->num_chunks);
    num(job, "uptime_s", (double)(s->t_ns - h->created_ns) / 1e9);
    cJSON *model = cJSON_AddObjectToObject(job, "model");
    cJSON_AddStringToObject(model, "path", h->job.model_path);
    cJSON_AddStringToObject(model, "type", h->model.model_type);
    cJSON_AddStringToObject(model, "architecture", h->model.architecture);
    num(model, "params", (double)h->num_params);
    num(model, "layers", h->model.num_layers);
    num(root, "step", st->step);
    num(root, "steps", h->job.steps);

    cJSON *stats = cJSON_AddObjectToObject(root, "stats");
    num(stats, "step", st->step);
    num(stats, "loss", st->loss);
    num(stats, "lr", st->lr);
    num(stats, "grad_norm", st->grad_norm);
    num(stats, "step_s", st->step_s);
    num(stats, "predicted_step_s", st->predicted_step_s);
    num(stats, "tok_s", st->tok_s);
    num(stats, "mfu", st->mfu);
    if (st->val_loss > 0) {
        num(stats, "val_loss", st->val_loss);
        num(stats, "val_acc", st->val_acc);
    } else {
        cJSON_AddNullToObject(stats, "val_loss");
        cJSON_AddNullToObject(stats, "val_acc");
    }
    num(stats, "tokens_total", (double)st->tokens_total);
    num(stats, "targets", (double)st->targets);
    num(stats, "documents", (double)st->documents);
    cJSON_AddStringToObject(stats, "attention", h->job.attention == ATTENTION_DOCUMENT ? "document" : "window");
    /* the losses of the last steps still in the ring, oldest first */
    uint32_t k0 = mon_history_first(st, (uint32_t)h->first_step);
    cJSON *hist = cJSON_AddObjectToObject(stats, "loss_history");
    num(hist, "first_step", k0);
    cJSON *losses = cJSON_AddArrayToObject(hist, "loss");
    for (uint32_t k = k0; k0 > 0 && k <= st->step; k++) {
        char buf[40];
        exact(buf, sizeof buf, st->loss_history[k % JOB_STATS_HISTORY]);
        cJSON_AddItemToArray(losses, cJSON_CreateRaw(buf));
    }

    cJSON_AddItemToObject(root, "workers",
                          json_procs(s->workers, s->gpus, "rank", worker_metrics, COUNT(worker_metrics), s->t_ns));
    cJSON_AddItemToObject(root, "optimizers",
                          json_procs(s->optims, s->optim_procs, "index", optim_metrics, COUNT(optim_metrics), s->t_ns));
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

/* ---- Prometheus text format 0.0.4 ---- */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void value(FILE *f, double v)
{
    if (isnan(v))
        fputs(" NaN\n", f);
    else if (isinf(v))
        fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
    else {
        char buf[40];
        exact(buf, sizeof buf, v);
        fprintf(f, " %s\n", buf);
    }
}

/* A label value with backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fputc('\\', f);
        if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void gauge(FILE *f, const char *name, const char *help, double v)
{
    family(f, name, "gauge", help);
    fputs(name, f);
    value(f, v);
}

static void job_metrics(FILE *f, const struct mon *m, const struct mon_snapshot *s)
{
    const struct ctl_header *h = m->h;
    const struct job_stats *st = &s->stats;
    family(f, "slidedp_job_info", "gauge", "The job this endpoint reports (always 1).");
    fputs("slidedp_job_info{job_name=", f);
    label_value(f, m->name);
    fputs(",model=", f);
    label_value(f, h->model.architecture);
    fputs(",device=", f);
    label_value(f, h->job.device == DEVICE_CPU ? "cpu" : "cuda");
    fputs(",log_dir=", f);
    label_value(f, h->job.log_dir);
    fputs("}", f);
    value(f, 1);
    gauge(f, "slidedp_launcher_pid", "Process id of the job's launcher.", s->launcher_pid);
    gauge(f, "slidedp_stopping", "1 while the job is stopping, else 0.", s->stop ? 1 : 0);
    gauge(f, "slidedp_uptime_seconds", "Seconds since the job's shared state was created.",
          (double)(s->t_ns - h->created_ns) / 1e9);
    gauge(f, "slidedp_model_parameters", "Trainable parameters of the model.", (double)h->num_params);
    gauge(f, "slidedp_steps", "Optimizer steps the job runs in all.", h->job.steps);
    gauge(f, "slidedp_step", "Last optimizer step logged to metrics.jsonl.", st->step);
    family(f, "slidedp_tokens_total", "counter", "Training tokens of the steps this launcher logged.");
    fputs("slidedp_tokens_total", f);
    value(f, (double)st->tokens_total);
    gauge(f, "slidedp_predicted_step_seconds", "Step time the planner predicted.", st->predicted_step_s);
    if (st->step == 0)
        return;
    gauge(f, "slidedp_loss", "Training loss of the last logged step.", st->loss);
    gauge(f, "slidedp_learning_rate", "Learning rate of the last logged step.", st->lr);
    gauge(f, "slidedp_grad_norm", "Global gradient L2 norm of the last logged step, before clipping.", st->grad_norm);
    gauge(f, "slidedp_step_targets", "Trained targets in the last logged step's global batch.", (double)st->targets);
    gauge(f, "slidedp_step_documents", "Documents in the last logged step's global batch.", (double)st->documents);
    gauge(f, "slidedp_step_seconds", "Measured time of the last logged step.", st->step_s);
    gauge(f, "slidedp_tokens_per_second", "Training throughput of the last logged step.", st->tok_s);
    gauge(f, "slidedp_mfu_ratio", "Model FLOPs utilisation of the last logged step (0 when peaks are unknown).",
          st->mfu);
    if (st->val_loss > 0) {
        gauge(f, "slidedp_val_loss", "Validation loss of the last validation pass.", st->val_loss);
        gauge(f, "slidedp_val_accuracy_ratio", "Next-token accuracy of the last validation pass.", st->val_acc);
    }
}

/* The families of one kind of process: info, phase (a state set: 1 for the current phase), then
 * the table's metrics. */
static void proc_families(FILE *f, const char *kind, const char *label, const struct mon_proc *procs, int n,
                          const struct proc_metric *pm, int num_metrics, uint64_t now_ns)
{
    char name[96], help[160];
    snprintf(name, sizeof name, "slidedp_%s_info", kind);
    snprintf(help, sizeof help, "Process id and device of each %s process (always 1).", kind);
    family(f, name, "gauge", help);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{%s=\"%d\",pid=\"%d\",device=", name, label, i, procs[i].pid);
        label_value(f, procs[i].device);
        fputs("}", f);
        value(f, 1);
    }
    snprintf(name, sizeof name, "slidedp_%s_phase", kind);
    snprintf(help, sizeof help, "1 for the phase each %s process is in, 0 for the others.", kind);
    family(f, name, "gauge", help);
    for (int i = 0; i < n; i++)
        for (uint32_t ph = 0; ph < PHASE_COUNT; ph++) {
            fprintf(f, "%s{%s=\"%d\",phase=\"%s\"}", name, label, i, mon_phase_name(ph));
            value(f, procs[i].phase == ph);
        }
    for (int k = 0; k < num_metrics; k++) {
        snprintf(name, sizeof name, "slidedp_%s_%s", kind, pm[k].prom);
        family(f, name, pm[k].type, pm[k].help);
        for (int i = 0; i < n; i++) {
            fprintf(f, "%s{%s=\"%d\"}", name, label, i);
            value(f, proc_value(&procs[i], pm[k].field, now_ns));
        }
    }
}

void mon_prometheus(FILE *f, const struct mon *m, const struct mon_snapshot *s)
{
    job_metrics(f, m, s);
    proc_families(f, "worker", "rank", s->workers, s->gpus, worker_metrics, COUNT(worker_metrics), s->t_ns);
    proc_families(f, "optimizer", "optimizer", s->optims, s->optim_procs, optim_metrics, COUNT(optim_metrics),
                  s->t_ns);
}
