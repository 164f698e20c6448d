/* Parses and validates an HF config.json (Qwen3, Qwen2/2.5, Llama 3) into struct model_config;
 * used by the launcher, the exporter and the tests. Defaults are those of transformers'
 * Qwen3Config, Qwen2Config and LlamaConfig. */
#include "model_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

#define CONFIG_MAX_BYTES (16u << 20)

struct family_info {
    enum model_family family;
    const char *model_type;
    const char *architecture;
    int max_position_embeddings; /* transformers' default */
};

static const struct family_info families[] = {
    {MODEL_QWEN3, "qwen3", "Qwen3ForCausalLM", 32768},
    {MODEL_QWEN2, "qwen2", "Qwen2ForCausalLM", 32768},
    {MODEL_LLAMA, "llama", "LlamaForCausalLM", 2048},
};

/* Renders a JSON value for an error message, shortened to fit buf. */
static const char *show(const cJSON *v, char *buf, size_t cap)
{
    char *s = cJSON_PrintUnformatted(v);
    snprintf(buf, cap, "%s", s ? s : "?");
    if (s && strlen(s) >= cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4);
    for (char *p = buf; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
    free(s);
    return buf;
}

static int bad_value(const char *what, const char *name, const cJSON *v, const char *why)
{
    char buf[80];
    return sd_err("%s: field '%s' = %s %s", what, name, show(v, buf, sizeof buf), why);
}

/* Python's json keeps the last of duplicate keys, cJSON the first: refuse them in the objects we
 * read (the top level and the RoPE objects) instead. */
static int check_duplicates(const char *what, const cJSON *obj)
{
    for (const cJSON *a = obj->child; a; a = a->next) {
        for (const cJSON *b = a->next; b; b = b->next)
            if (!strcmp(a->string, b->string))
                return sd_err("%s: field '%.64s' appears twice", what, a->string);
        if (cJSON_IsObject(a) && (!strcmp(a->string, "rope_scaling") || !strcmp(a->string, "rope_parameters")) &&
            check_duplicates(what, a) < 0)
            return -1;
    }
    return 0;
}

/* The field's value, or NULL when absent or null. */
static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNull(v) ? NULL : v;
}

static int get_int(const char *what, const cJSON *obj, const char *name, bool required, int def, int *out)
{
    const cJSON *v = field(obj, name);
    if (!v) {
        if (required)
            return sd_err("%s: missing required field '%s'", what, name);
        *out = def;
        return 0;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0;
    if (cJSON_IsNumber(v) && d > INT_MAX)
        return bad_value(what, name, v, "is out of range: it must be an integer from 1 to 2147483647");
    if (!cJSON_IsNumber(v) || !(d >= 1 && d <= INT_MAX) || d != (double)(int)d)
        return bad_value(what, name, v, "is not a positive integer");
    *out = (int)d;
    return 0;
}

static int get_double(const char *what, const cJSON *obj, const char *name, double def, double *out)
{
    const cJSON *v = field(obj, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < 1e300))
        return bad_value(what, name, v, "is not a non-negative number");
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const char *what, const cJSON *obj, const char *name, bool def, bool *out)
{
    const cJSON *v = field(obj, name);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return bad_value(what, name, v, "is not true or false");
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Fields whose presence with a non-default value means an architecture we do not model. */
static int check_unsupported(const char *what, const cJSON *root, enum model_family fam)
{
    static const char *const moe[] = {"num_experts", "num_local_experts", "num_experts_per_tok",
                                      "moe_intermediate_size", "n_routed_experts", "n_shared_experts"};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        const cJSON *v = field(root, moe[i]);
        if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0))
            return bad_value(what, moe[i], v, "is not supported (mixture-of-experts layers)");
    }
    bool b = false;
    if (get_bool(what, root, "use_sliding_window", false, &b) < 0)
        return -1;
    if (b)
        return bad_value(what, "use_sliding_window", field(root, "use_sliding_window"),
                         "is not supported (sliding-window attention)");
    if (fam != MODEL_QWEN2) { /* Qwen2 always has q/k/v biases and ignores this field */
        if (get_bool(what, root, "attention_bias", false, &b) < 0)
            return -1;
        if (b)
            return bad_value(what, "attention_bias", field(root, "attention_bias"),
                             "is not supported (attention projection biases)");
    }
    if (get_bool(what, root, "mlp_bias", false, &b) < 0)
        return -1;
    if (b)
        return bad_value(what, "mlp_bias", field(root, "mlp_bias"), "is not supported (MLP biases)");
    const cJSON *act = field(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && !strcmp(act->valuestring, "silu")))
        return bad_value(what, "hidden_act", act, "is not supported (only \"silu\")");
    const cJSON *prf = field(root, "partial_rotary_factor");
    if (prf && !(cJSON_IsNumber(prf) && prf->valuedouble == 1.0))
        return bad_value(what, "partial_rotary_factor", prf, "is not supported (RoPE on the whole head)");
    return 0;
}

static int check_layer_types(const char *what, const cJSON *root, int num_layers)
{
    const cJSON *lt = field(root, "layer_types");
    if (!lt)
        return 0;
    if (!cJSON_IsArray(lt))
        return bad_value(what, "layer_types", lt, "is not an array");
    int i = 0;
    for (const cJSON *e = lt->child; e; e = e->next, i++)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention")) {
            char name[32];
            snprintf(name, sizeof name, "layer_types[%d]", i);
            return bad_value(what, name, e, "is not supported (only \"full_attention\")");
        }
    if (i != num_layers)
        return sd_err("%s: field 'layer_types' has %d entries but num_hidden_layers is %d", what, i, num_layers);
    return 0;
}

/* A positive number obj.key of a RoPE object (integral when integer is set), named "name.key" in
 * errors. */
static int rope_number(const char *what, const char *name, const cJSON *obj, const char *key, bool integer,
                       double *out)
{
    char f[64];
    snprintf(f, sizeof f, "%s.%s", name, key);
    const cJSON *v = field(obj, key);
    if (!v)
        return sd_err("%s: missing required field '%s'", what, f);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1e300) ||
        (integer && (v->valuedouble > INT_MAX || v->valuedouble != (double)(int)v->valuedouble)))
        return bad_value(what, f, v, integer ? "is not a positive integer" : "is not a positive number");
    *out = v->valuedouble;
    return 0;
}

/* Parses a rope_scaling (transformers 4) or rope_parameters (transformers 5) object. An absent type
 * means "default" for rope_parameters; rope_scaling must name its type. */
static int parse_rope(const char *what, const char *name, const cJSON *obj, bool type_required,
                      struct rope_scaling *rs, double *theta, bool *has_theta)
{
    memset(rs, 0, sizeof *rs);
    *has_theta = false;
    if (!cJSON_IsObject(obj))
        return bad_value(what, name, obj, "is not an object");
    const char *type_key = field(obj, "rope_type") ? "rope_type" : "type";
    const cJSON *type = field(obj, type_key);
    char f[64];
    snprintf(f, sizeof f, "%s.%s", name, type_key);
    if (type && !cJSON_IsString(type))
        return bad_value(what, f, type, "is not a string");
    if (!type && type_required)
        return sd_err("%s: field '%s' has no 'rope_type'", what, name);
    if (field(obj, "rope_theta")) {
        if (rope_number(what, name, obj, "rope_theta", false, theta) < 0)
            return -1;
        *has_theta = true;
    }
    if (!type || !strcmp(type->valuestring, "default"))
        return 0;
    if (strcmp(type->valuestring, "llama3"))
        return bad_value(what, f, type, "is not supported (only \"default\" and \"llama3\")");
    rs->type = ROPE_SCALING_LLAMA3;
    double omax;
    if (rope_number(what, name, obj, "factor", false, &rs->factor) < 0 ||
        rope_number(what, name, obj, "low_freq_factor", false, &rs->low_freq_factor) < 0 ||
        rope_number(what, name, obj, "high_freq_factor", false, &rs->high_freq_factor) < 0 ||
        rope_number(what, name, obj, "original_max_position_embeddings", true, &omax) < 0)
        return -1;
    rs->original_max_position_embeddings = (int)omax;
    if (rs->high_freq_factor <= rs->low_freq_factor)
        return sd_err("%s: field '%s.high_freq_factor' = %g is not greater than low_freq_factor = %g", what, name,
                      rs->high_freq_factor, rs->low_freq_factor);
    return 0;
}

static bool same_scaling(const struct rope_scaling *a, const struct rope_scaling *b)
{
    return a->type == b->type && a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings;
}

static int parse_rope_all(const char *what, const cJSON *root, struct model_config *c)
{
    double t_top = 0, t_params = 0, t_scaling = 0;
    bool has_params_theta = false, has_scaling_theta = false;
    struct rope_scaling from_params = {0}, from_scaling = {0};
    if (get_double(what, root, "rope_theta", 10000.0, &t_top) < 0)
        return -1;
    if (t_top <= 0)
        return bad_value(what, "rope_theta", field(root, "rope_theta"), "is not positive");
    const cJSON *params = field(root, "rope_parameters"), *scaling = field(root, "rope_scaling");
    if (params && parse_rope(what, "rope_parameters", params, false, &from_params, &t_params, &has_params_theta) < 0)
        return -1;
    if (scaling && parse_rope(what, "rope_scaling", scaling, true, &from_scaling, &t_scaling, &has_scaling_theta) < 0)
        return -1;
    if (params && scaling && !same_scaling(&from_params, &from_scaling))
        return sd_err("%s: fields 'rope_parameters' and 'rope_scaling' describe different RoPE scalings", what);
    c->rope_scaling = params ? from_params : from_scaling;
    c->rope_theta = has_params_theta ? t_params : has_scaling_theta ? t_scaling : t_top;
    return 0;
}

static int parse_dtype(const char *what, const cJSON *root, struct model_config *c)
{
    const char *key = field(root, "dtype") ? "dtype" : "torch_dtype";
    const cJSON *v = field(root, key);
    if (!v) {
        snprintf(c->torch_dtype, sizeof c->torch_dtype, "bfloat16");
        return 0;
    }
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= sizeof c->torch_dtype || !v->valuestring[0])
        return bad_value(what, key, v, "is not a dtype name");
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", v->valuestring);
    return 0;
}

static int parse_family(const char *what, const cJSON *root, struct model_config *c)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!mt)
        return sd_err("%s: missing required field 'model_type'", what);
    const struct family_info *fi = NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (cJSON_IsString(mt) && !strcmp(mt->valuestring, families[i].model_type))
            fi = &families[i];
    if (!fi)
        return bad_value(what, "model_type", mt, "is not supported (expected \"qwen3\", \"qwen2\" or \"llama\")");
    c->family = fi->family;
    snprintf(c->model_type, sizeof c->model_type, "%s", fi->model_type);
    snprintf(c->architecture, sizeof c->architecture, "%s", fi->architecture);
    c->max_position_embeddings = fi->max_position_embeddings;
    const cJSON *arch = field(root, "architectures");
    if (arch) {
        if (!cJSON_IsArray(arch) || !arch->child)
            return bad_value(what, "architectures", arch, "is not a non-empty array");
        if (!cJSON_IsString(arch->child) || strcmp(arch->child->valuestring, fi->architecture)) {
            char msg[128];
            snprintf(msg, sizeof msg, "is not supported (model_type \"%s\" needs \"%s\")", fi->model_type,
                     fi->architecture);
            return bad_value(what, "architectures[0]", arch->child, msg);
        }
    }
    return 0;
}

/* num_key_value_heads and head_dim with transformers' defaults: when absent (not null), Qwen2Config
 * and Qwen3Config default num_key_value_heads to 32 and Qwen3Config defaults head_dim to 128;
 * otherwise they are num_attention_heads and hidden_size / num_attention_heads. */
static int parse_heads(const char *what, const cJSON *root, struct model_config *c)
{
    bool kv_absent = !cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads");
    bool hd_absent = !cJSON_GetObjectItemCaseSensitive(root, "head_dim");
    int kv_def = kv_absent && c->family != MODEL_LLAMA ? 32 : c->num_heads;
    if (get_int(what, root, "num_key_value_heads", false, kv_def, &c->num_kv_heads) < 0)
        return -1;
    if (c->num_heads % c->num_kv_heads)
        return sd_err("%s: field 'num_attention_heads' = %d is not divisible by num_key_value_heads = %d%s", what,
                      c->num_heads, c->num_kv_heads, kv_absent ? " (the default when the field is absent)" : "");
    if (hd_absent && c->family == MODEL_QWEN3) {
        c->head_dim = 128;
    } else if (!field(root, "head_dim")) {
        if (c->hidden_size % c->num_heads)
            return sd_err("%s: field 'hidden_size' = %d is not divisible by num_attention_heads = %d (needed to "
                          "derive head_dim)", what, c->hidden_size, c->num_heads);
        c->head_dim = c->hidden_size / c->num_heads;
    } else if (get_int(what, root, "head_dim", true, 0, &c->head_dim) < 0) {
        return -1;
    }
    if (c->head_dim % 2)
        return sd_err("%s: field 'head_dim' = %d is odd (RoPE pairs dimensions)", what, c->head_dim);
    return 0;
}

int model_config_parse(const char *json_text, const char *what, struct model_config *out)
{
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json_text, &end, 1);
    if (!root)
        return sd_err("%s: not valid JSON (error near byte %zu)", what, end ? (size_t)(end - json_text) : 0);
    struct model_config c;
    memset(&c, 0, sizeof c);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        sd_err("%s: not a JSON object", what);
        goto done;
    }
    if (check_duplicates(what, root) < 0)
        goto done;
    if (parse_family(what, root, &c) < 0 || check_unsupported(what, root, c.family) < 0 ||
        get_int(what, root, "vocab_size", true, 0, &c.vocab_size) < 0 ||
        get_int(what, root, "hidden_size", true, 0, &c.hidden_size) < 0 ||
        get_int(what, root, "intermediate_size", true, 0, &c.intermediate_size) < 0 ||
        get_int(what, root, "num_hidden_layers", true, 0, &c.num_layers) < 0 ||
        get_int(what, root, "num_attention_heads", true, 0, &c.num_heads) < 0 ||
        get_int(what, root, "max_position_embeddings", false, c.max_position_embeddings,
                &c.max_position_embeddings) < 0 ||
        check_layer_types(what, root, c.num_layers) < 0 || parse_heads(what, root, &c) < 0 ||
        get_double(what, root, "rms_norm_eps", 1e-6, &c.rms_norm_eps) < 0 ||
        get_double(what, root, "initializer_range", 0.02, &c.initializer_range) < 0 ||
        get_bool(what, root, "tie_word_embeddings", false, &c.tie_word_embeddings) < 0 ||
        parse_rope_all(what, root, &c) < 0 || parse_dtype(what, root, &c) < 0)
        goto done;
    if (c.rms_norm_eps <= 0) {
        bad_value(what, "rms_norm_eps", field(root, "rms_norm_eps"), "is not positive");
        goto done;
    }
    c.qk_norm = c.family == MODEL_QWEN3;
    c.qkv_bias = c.family == MODEL_QWEN2;
    *out = c;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

int model_config_load(const char *config_json_path, struct model_config *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(config_json_path, "rb");
    if (!f)
        return sd_err("%s: cannot open: %s", config_json_path, strerror(errno));
    char *text = malloc(CONFIG_MAX_BYTES + 1);
    if (!text) {
        fclose(f);
        return sd_err("%s: out of memory", config_json_path);
    }
    size_t n = fread(text, 1, CONFIG_MAX_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    int rc;
    if (err)
        rc = sd_err("%s: read error", config_json_path);
    else if (n > CONFIG_MAX_BYTES)
        rc = sd_err("%s: larger than %u bytes: not a config.json", config_json_path, CONFIG_MAX_BYTES);
    else if (memchr(text, 0, n))
        rc = sd_err("%s: contains a NUL byte: not a config.json", config_json_path);
    else {
        text[n] = 0;
        rc = model_config_parse(text, config_json_path, out);
    }
    free(text);
    return rc;
}

size_t model_config_num_params(const struct model_config *cfg)
{
    size_t C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size, D = (size_t)cfg->head_dim;
    size_t V = (size_t)cfg->vocab_size, q = (size_t)cfg->num_heads * D, kv = (size_t)cfg->num_kv_heads * D;
    size_t layer = 2 * C                  /* input_layernorm, post_attention_layernorm */
                   + q * C + 2 * kv * C   /* q, k, v */
                   + C * q                /* o */
                   + 3 * I * C;           /* gate, up, down */
    if (cfg->qkv_bias)
        layer += q + 2 * kv;
    if (cfg->qk_norm)
        layer += 2 * D;
    return V * C + (size_t)cfg->num_layers * layer + C + (cfg->tie_word_embeddings ? 0 : V * C);
}

bool model_config_seq_len_warning(const struct model_config *cfg, int seq_len, char *out, size_t len)
{
    if (seq_len <= cfg->max_position_embeddings)
        return false;
    snprintf(out, len,
             "warning: data.seq_len %d is above the model's max_position_embeddings %d: the positions beyond it "
             "were never trained (this extends the context; raise max_position_embeddings in config.json, with "
             "rope_scaling as the model needs, to say so)",
             seq_len, cfg->max_position_embeddings);
    return true;
}
